import { AppError, type TrainPayload } from '../../shared/index.js';
import { collectFingerprint, fingerprintChanges, type EnvFingerprint } from './fingerprint.js';
import type { StartCheck } from './start-checks.js';
import type { TrainDeps } from './train-deps.js';

/**
 * The trainer environment's fingerprint against the last good run's, written to the status. A
 * change fails the job unless `train.allowEnvChange` allows it (then it is logged).
 */
export async function checkEnvironment(
  p: TrainPayload,
  deps: TrainDeps,
  start: Extract<StartCheck, { kind: 'start' }>,
): Promise<{ fp: EnvFingerprint; changes: string[] }> {
  const { probe, verdict, seenJson } = start;
  const assigned = verdict.assigned;
  const log = deps.logger;
  const fp = await collectFingerprint({
    command: p.command,
    ...(p.python === undefined ? {} : { python: p.python }),
    cwd: p.cwd,
    gpus: assigned,
    driver: verdict.seen[0]?.driver ?? probe.gpus[0]?.driver ?? null,
  });
  const lastGood = await deps.lastGoodEnv();
  const changes = lastGood === null ? [] : fingerprintChanges(lastGood, fp);
  await deps.setStatus({
    fingerprint: JSON.stringify(fp),
    envChanges: JSON.stringify(changes),
    preflight: seenJson,
    waiting: '',
  });
  if (changes.length > 0) {
    if (!p.allowEnvChange) {
      throw new AppError(
        `the trainer environment changed since the last successful train run: ${changes.join('; ')}. ` +
          'Training a run on another stack is how a run dies (e.g. of out-of-memory) hours in; set train.allowEnvChange: true or pass --allow-env-change to start anyway',
      );
    }
    deps.jobLog(`environment changed (allowed): ${changes.join('; ')}`);
    log.warn({ changes }, 'the trainer environment changed since the last successful run (allowed)');
  }
  return { fp, changes };
}
