import { defineConfig } from 'vitest/config';
import SlowestFilesReporter from './test/helpers/slowest-files.js';

// The fault suite (test/faults): real processes killed, frozen and cut off, a minute of chaos.
// Its files run one at a time, after the rest of the suite, so that their timing-sensitive
// assertions (caps, stalls, recovery) never compete with other tests for the CPU.
export default defineConfig({
  test: {
    include: ['test/faults/**/*.test.ts'],
    setupFiles: ['test/helpers/setup.ts'],
    // The default output, then the ten slowest files and their seconds.
    reporters: ['default', new SlowestFilesReporter(10)],
    testTimeout: 300_000,
    hookTimeout: 120_000,
    fileParallelism: false,
    maxWorkers: 1,
  },
});
