import type { TrainPayload } from '../../shared/index.js';
import { createAttempt, resolveResumeCheckpoint } from './attempts.js';
import { placeChainStep, withStepOutputs, type ChainStepPlace } from './chain.js';
import { buildArgv } from './command.js';
import type { AssignedGroup, GpuInfo } from '../gpu/index.js';
import type { TrainDeps } from './train-deps.js';

/** What a job runs, and where: its command line, attempt folder and checkpoint. */
export interface PlannedAttempt {
  attempt: { attempt: string; dir: string; checkpoints: string; log: string };
  argv: string[];
  /** The checkpoint resumed from (none for a chain step). */
  checkpoint: TrainPayload['checkpoint'];
  /** A chain step's place (its attempt folder), null outside a chain. */
  place: ChainStepPlace | null;
}

/**
 * What to run, then a new attempt folder (earlier ones are never touched): a chain step runs in
 * its chain's attempt, whole; a plain run resumes from its checkpoint (refused before an attempt
 * folder is made when the command has no `{checkpoint}`) or starts from scratch.
 */
export async function planAttempt(
  p: TrainPayload,
  deps: TrainDeps,
  o: {
    mode: TrainPayload['mode'];
    checkpoint: TrainPayload['checkpoint'];
    place: ChainStepPlace | null;
    previousStep: { attemptDir: string | null } | null;
    assigned: readonly GpuInfo[];
    /** A split step's groups as preflight assigned them. */
    groups: readonly AssignedGroup[] | null;
  },
): Promise<PlannedAttempt> {
  const { mode, previousStep, assigned } = o;
  const groups = groupIndices(o.groups);
  let { checkpoint, place } = o;
  let attempt: { attempt: string; dir: string; checkpoints: string; log: string };
  let argv: string[];
  if (p.steps !== undefined) {
    // A chain step reruns whole: it has no checkpoint of its own to resume.
    place ??= await placeChainStep({ ...p, mode }, previousStep, deps.jobId);
    attempt = { attempt: place.attempt, dir: place.attemptDir, checkpoints: place.output, log: place.log };
    argv = withStepOutputs(
      buildArgv(p.command, [], {
        dataset: p.dataset,
        output: place.output,
        checkpoint: null,
        gpus: assigned.map((g) => g.index),
        groups,
      }),
      p,
      place.attemptDir,
    );
    checkpoint = undefined;
  } else {
    if (mode === 'resume') checkpoint = await resolveResumeCheckpoint(p.runDir, checkpoint);
    const argvOf = (output: string): string[] =>
      buildArgv(p.command, p.resumeArgs, {
        dataset: p.dataset,
        output,
        checkpoint: mode === 'resume' ? (checkpoint ?? null) : null,
        gpus: assigned.map((g) => g.index),
        groups,
      });
    argvOf(''); // refuse a resume without {checkpoint} before an attempt folder is made
    attempt = await createAttempt(p.runDir, {
      jobId: deps.jobId,
      mode,
      resumedFrom: mode === 'resume' ? (checkpoint ?? null) : null,
    });
    argv = argvOf(attempt.checkpoints);
  }
  return { attempt, argv, checkpoint, place };
}

/** A split step's groups as index lists (null for a step that is not split). */
export function groupIndices(groups: readonly AssignedGroup[] | null): { target: number[]; drafter: number[] } | null {
  if (groups === null) return null;
  const of = (name: string): number[] => groups.find((g) => g.name === name)?.gpus.map((g) => g.index) ?? [];
  return { target: of('target'), drafter: of('drafter') };
}
