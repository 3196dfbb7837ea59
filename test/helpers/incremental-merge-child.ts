// The merge half of a post-process round in its own process, killed at a crash point:
//   node --import tsx test/helpers/incremental-merge-child.ts <json file>
// where the file holds {"setup":RoundSetup,"flowId","results":[tokenize job results],"crashAt"}.
import { readFileSync } from 'node:fs';

import { createRootLogger, mergeIntoTarget, type MergeCrashPoint } from '../../src/shared/index.js';
import type { TokenizeJobResult } from '../../src/workers/postprocess/processor.js';
import { mergeRound, type RoundSetup } from './incremental-round.js';

interface ChildJob {
  setup: RoundSetup;
  flowId: string;
  results: TokenizeJobResult[];
  crashAt?: MergeCrashPoint;
}

async function main(): Promise<void> {
  const job = JSON.parse(readFileSync(process.argv[2] ?? '', 'utf8')) as ChildJob;
  const logger = createRootLogger({ level: 'silent' });
  const r = await mergeRound({ ...job.setup, logger }, job.flowId, job.results, (opts) =>
    mergeIntoTarget({ ...opts, ...(job.crashAt === undefined ? {} : { crashAt: job.crashAt }) }),
  );
  process.stdout.write(`${JSON.stringify({ status: r.status })}\n`);
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
