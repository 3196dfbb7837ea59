import { statfs, mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { FlowJob } from 'bullmq';
import {
  AppError,
  TRAIN_QUEUE,
  exists,
  TrainPayloadSchema,
  parsePayload,
  trainJobOptions,
  withEvalParent,
  type TrainPayload,
} from '../../shared/index.js';
import { createAttempt, describeAttempts, trainDir } from './attempts.js';

/**
 * Chains of GPU steps (`train.steps`): one train job per step, each the parent of the one
 * before it (the first step's child is the round's merge, if any), so a step starts only after
 * the previous one completed, and a failed step fails the rest of the chain. The chain's attempt
 * folder holds one folder per step, `<attempt>/<step>/` (`train.log`, `output/`,
 * `environment.json`, and `done.json` once it exited 0); a rerun with `--resume` takes the
 * latest attempt and skips the steps that are done.
 */

/** The job id of step `index` of a chain whose last step has id `baseId`. */
export function stepJobId(baseId: string, payload: TrainPayload, index: number): string {
  const steps = payload.steps ?? [];
  return index === steps.length - 1 ? baseId : `${baseId}-${steps[index]?.name ?? index}`;
}

/**
 * The payload of step `index` of the chain whose last step has id `chain`: the chain's payload
 * with the step's command, GPUs, limits and hidden states.
 */
export function stepPayload(payload: TrainPayload, index: number, chain?: string): TrainPayload {
  const step = payload.steps?.[index];
  if (step === undefined) throw new AppError(`train: no step ${index} in the chain`);
  return parsePayload(
    TrainPayloadSchema,
    {
      ...payload,
      command: step.command,
      gpus: step.gpus,
      minFreeGpuMemMiB: step.minFreeGpuMemMiB,
      minFreeDiskGiB: step.minFreeDiskGiB,
      ...(step.hiddenStates === undefined ? {} : { hiddenStates: step.hiddenStates }),
      gpuGroups: step.gpuGroups,
      stepIndex: index,
      ...(chain === undefined ? {} : { chain }),
    },
    'train',
  );
}

/**
 * The train jobs for `payload` as a flow: one job, or for a chain the last step over the one
 * before … over the first, over `child` (a round's merge) if given; the train job (the chain's
 * last step) has id `baseId`. With `payload.evaluate`, the root is the eval job above it
 * (`eval ◀ train`), which starts once the attempt completed. Every child fails its parent when
 * it fails.
 */
export function trainFlow(payload: TrainPayload, baseId: string, child?: FlowJob): FlowJob {
  const { evaluate, ...train } = payload;
  const flow = trainJobsFlow(parsePayload(TrainPayloadSchema, train, 'train'), baseId, child);
  return evaluate === undefined ? flow : withEvalParent(flow, evaluate);
}

function trainJobsFlow(payload: TrainPayload, baseId: string, child?: FlowJob): FlowJob {
  const failing = (f: FlowJob): FlowJob => ({ ...f, opts: { ...f.opts, failParentOnFailure: true } });
  if (payload.steps === undefined) {
    return {
      name: 'train',
      queueName: TRAIN_QUEUE,
      data: payload,
      opts: { ...trainJobOptions, jobId: baseId },
      ...(child === undefined ? {} : { children: [failing(child)] }),
    };
  }
  let below: FlowJob | undefined = child;
  for (let i = 0; i < payload.steps.length; i++) {
    const job: FlowJob = {
      name: `train ${payload.steps[i]?.name ?? i}`,
      queueName: TRAIN_QUEUE,
      data: stepPayload(payload, i, baseId),
      opts: { ...trainJobOptions, jobId: stepJobId(baseId, payload, i) },
      ...(below === undefined ? {} : { children: [failing(below)] }),
    };
    below = job;
  }
  if (below === undefined) throw new AppError('train: a chain without steps');
  return below;
}

/** Where a chain step runs. */
export interface ChainStepPlace {
  attempt: string;
  attemptDir: string;
  stepDir: string;
  output: string;
  log: string;
  /** The step finished in an earlier run (its `done.json`). */
  done: boolean;
}

/**
 * The attempt folder a chain step runs in: the first step makes a new attempt (from scratch) or
 * takes the latest one (resume); later steps take their previous step's.
 */
export async function placeChainStep(
  p: TrainPayload,
  previous: { attemptDir: string | null } | null,
  jobId: string,
): Promise<ChainStepPlace> {
  const index = p.stepIndex ?? 0;
  const name = p.steps?.[index]?.name ?? String(index);
  let attemptDir: string;
  if (index > 0) {
    if (previous?.attemptDir === null || previous?.attemptDir === undefined)
      throw new AppError(`train step ${name}: the previous step left no attempt folder`);
    attemptDir = previous.attemptDir;
  } else if (p.mode === 'resume') {
    const latest = (await describeAttempts(p.runDir)).at(-1);
    if (latest === undefined)
      throw new AppError(
        `resume: nothing to resume — no training attempt under ${trainDir(p.runDir)}; start one with --from-scratch`,
      );
    attemptDir = latest.dir;
  } else {
    attemptDir = (await createAttempt(p.runDir, { jobId, mode: p.mode, resumedFrom: null })).dir;
  }
  const stepDir = path.join(attemptDir, name);
  await mkdir(path.join(stepDir, 'output'), { recursive: true });
  return {
    attempt: path.basename(attemptDir),
    attemptDir,
    stepDir,
    output: path.join(stepDir, 'output'),
    log: path.join(stepDir, 'train.log'),
    done: await exists(path.join(stepDir, 'done.json')),
  };
}

/** Replaces `{output:<step>}` with that step's output folder in the chain's attempt. */
export function withStepOutputs(argv: readonly string[], p: TrainPayload, attemptDir: string): string[] {
  const names = new Set((p.steps ?? []).map((s) => s.name));
  return argv.map((a) =>
    a.replace(/\{output:([^}]+)\}/g, (_m, n: string) => {
      if (!names.has(n))
        throw new AppError(
          `train step ${p.steps?.[p.stepIndex ?? 0]?.name ?? ''}: {output:${n}} names no step of train.steps (${[...names].join(', ')})`,
        );
      return path.join(attemptDir, n, 'output');
    }),
  );
}

/** Records that a chain step finished (a rerun skips it). */
export async function markStepDone(place: ChainStepPlace, info: Record<string, unknown>): Promise<void> {
  await writeFile(
    path.join(place.stepDir, 'done.json'),
    `${JSON.stringify({ ...info, finishedAt: new Date().toISOString() }, null, 2)}\n`,
  );
}

/** When the step was done, from its `done.json`. */
export async function doneInfo(place: ChainStepPlace): Promise<string> {
  try {
    const v = JSON.parse(await readFile(path.join(place.stepDir, 'done.json'), 'utf8')) as { finishedAt?: string };
    return v.finishedAt ?? '';
  } catch {
    return '';
  }
}

/** Free space (GiB) of the file system holding `dir` (or its nearest existing ancestor). */
export async function freeDiskGiB(dir: string): Promise<{ path: string; freeGiB: number }> {
  let p = dir;
  while (!(await exists(p)) && path.dirname(p) !== p) p = path.dirname(p);
  const s = await statfs(p);
  return { path: p, freeGiB: (s.bavail * s.bsize) / 2 ** 30 };
}
