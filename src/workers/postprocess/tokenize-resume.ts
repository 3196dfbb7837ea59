import { offsetsOfState, type Logger, type TokenizePayload } from '../../shared/index.js';
import type { TokenizeContext } from './tokenize.js';
import { planResume, tokenizeSettings, type FileStart } from './generation-offsets.js';
import { listGenerationFiles } from './tokenize-records.js';
import type { MergedKeys } from './merged-keys.js';

/** Where each generation file of a dataset starts, from the offsets committed with `merged`'s version. */
export async function resumeOf(
  p: TokenizePayload,
  merged: MergedKeys,
  ctx: TokenizeContext,
  log: Logger,
): Promise<Map<string, FileStart>> {
  const committed = merged.stateText === undefined ? undefined : await offsetsOfState(p.target, merged.stateText);
  const plan = await planResume(
    await listGenerationFiles(p.source),
    committed?.datasets[p.dataset],
    tokenizeSettings(ctx),
  );
  if (plan.fullRead !== undefined) {
    log.info(
      { source: p.source, reason: plan.fullRead },
      'reading every generation line of the dataset (no usable offsets)',
    );
  } else {
    log.info(
      { source: p.source, files: plan.starts.size },
      'reading only the generation lines written since the last merged round',
    );
  }
  return plan.starts;
}
