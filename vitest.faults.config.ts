import { defineConfig } from 'vitest/config';

// The fault suite (test/faults): real processes killed, frozen and cut off, a minute of chaos.
// Its files run one at a time, after the rest of the suite, so that their timing-sensitive
// assertions (caps, stalls, recovery) never compete with other tests for the CPU.
export default defineConfig({
  test: {
    include: ['test/faults/**/*.test.ts'],
    setupFiles: ['test/helpers/setup.ts'],
    testTimeout: 300_000,
    hookTimeout: 120_000,
    fileParallelism: false,
    maxWorkers: 1,
  },
});
