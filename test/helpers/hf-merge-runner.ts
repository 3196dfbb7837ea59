// Runs one merge or rollback in its own process, so that tests can SIGKILL it at a crash
// point and then inspect what it left. Usage:
//   node --import tsx test/helpers/hf-merge-runner.ts '<json>'
// where <json> is {"op":"merge","target","runDir","shardSizeMiB","rows":{"prefix","count","seed"},
// "mergeKey"?, "crashAt"?} or {"op":"rollback","target","runDir","crashAt"?}. Prints the result as JSON.
import {
  mergeIntoTarget,
  rollbackTarget,
  type MergeCrashPoint,
  type RollbackCrashPoint,
} from '../../src/shared/hf-dataset/index.js';
import { createRootLogger } from '../../src/shared/logger.js';
import { makeRows } from '../fixtures/hf/rows.js';

interface MergeJob {
  op: 'merge';
  target: string;
  runDir: string;
  shardSizeMiB: number;
  rows: { prefix: string; count: number; seed: number };
  mergeKey?: string;
  crashAt?: MergeCrashPoint;
}
interface RollbackJob {
  op: 'rollback';
  target: string;
  runDir: string;
  crashAt?: RollbackCrashPoint;
}

async function main(): Promise<void> {
  createRootLogger({ level: 'warn' });
  const job = JSON.parse(process.argv[2] ?? '{}') as MergeJob | RollbackJob;
  if (job.op === 'merge') {
    const r = await mergeIntoTarget({
      target: job.target,
      runDir: job.runDir,
      shardSizeMiB: job.shardSizeMiB,
      newRows: makeRows(job.rows.prefix, job.rows.count, job.rows.seed),
      ...(job.mergeKey === undefined ? {} : { mergeKey: job.mergeKey }),
      ...(job.crashAt === undefined ? {} : { crashAt: job.crashAt }),
    });
    process.stdout.write(`${JSON.stringify({ ok: true, rows: r.report.rows, repaired: r.repaired })}\n`);
  } else {
    const r = await rollbackTarget({
      target: job.target,
      runDir: job.runDir,
      ...(job.crashAt === undefined ? {} : { crashAt: job.crashAt }),
    });
    process.stdout.write(`${JSON.stringify({ ok: true, undone: r.undoneMergeId })}\n`);
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
