// An inference worker in a process of its own, for the budget tests that race two worker
// processes: `node --import tsx budget-worker-child.ts '<ChildOptions as JSON>'`.
// Prints `ready` once started; SIGTERM stops it cleanly, SIGKILL is a crash.
import { RunKeys, createRootLogger, type InferenceStageOptions } from '../../src/shared/index.js';
import { InferenceWorker } from '../../src/workers/inference/worker.js';

interface ChildOptions {
  redisUrl: string;
  prefix: string;
  run: string;
  /** `inferenceOptions(config)`, as the test process compiled it. */
  options: InferenceStageOptions;
  workerId: string;
}

const o = JSON.parse(process.argv[2] ?? '{}') as ChildOptions;
createRootLogger({ level: process.env['TOKENMILL_TEST_LOG_LEVEL'] ?? 'warn' });
const worker = new InferenceWorker({
  ...o.options,
  redisUrl: o.redisUrl,
  keys: new RunKeys(o.prefix, o.run),
  workerId: o.workerId,
});
await worker.start();
process.stdout.write('ready\n');
process.once('SIGTERM', () => {
  void worker.stop(2_000).then(() => process.exit(0));
});
