import { defineConfig } from 'vitest/config';
import SlowestFilesReporter from './test/helpers/slowest-files.js';

// The real-SGLang suite (test/sglang, `npm run test:sglang`): tokenmill against a real SGLang 0.5.23
// on CPU (scripts/setup-sglang.sh installs it). One server for the suite (test/sglang/global-setup.ts),
// files one at a time (they share it, and it takes the CPU), long timeouts (a few hundred tokens/s).
// Without the server installed, every file skips with the reason.
export default defineConfig({
  test: {
    include: ['test/sglang/**/*.test.ts'],
    setupFiles: ['test/helpers/setup.ts'],
    // The default output, then the ten slowest files and their seconds.
    reporters: ['default', new SlowestFilesReporter(10)],
    globalSetup: ['test/sglang/global-setup.ts'],
    testTimeout: 240_000,
    hookTimeout: 240_000,
    fileParallelism: false,
    maxWorkers: 1,
  },
});
