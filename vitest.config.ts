import { defineConfig } from 'vitest/config';
import SlowestFilesReporter from './test/helpers/slowest-files.js';

export default defineConfig({
  test: {
    include: ['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts'],
    setupFiles: ['test/helpers/setup.ts'],
    // The default output, then the ten slowest files and their seconds.
    reporters: ['default', new SlowestFilesReporter(10)],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Integration tests start real processes (redis-server, the simulator, workers);
    // the CI machine has two cores, so files run two at a time.
    maxWorkers: 2,
    fileParallelism: true,
  },
});
