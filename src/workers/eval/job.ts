/**
 * The eval step: one eval job per completed training attempt (the train job is its child in the
 * flow). It picks the attempt's drafter, measures it (starting `eval.server`'s servers when
 * configured), writes `<attempt>/eval.json`, records the report for the status, and fails when
 * the verdict is below `eval.minAcceptLength` / `eval.minSpeedup`. The training stays completed.
 */
import { hostname } from 'node:os';
import path from 'node:path';
import {
  AppError,
  CancelledError,
  EvalJobPayloadSchema,
  parsePayload,
  type ChatTokenizer,
  type Config,
  type EvalJobResult,
  type Logger,
} from '../../shared/index.js';
import { recordedIdentity, type GpuProbe } from '../train/index.js';
import { chooseDrafter, evalReportPath } from './drafter.js';
import { measureDrafter } from './measure.js';
import type { EvalReport } from './report.js';
import { writeEvalReport, type EvalConfigured, type EvalRunConfig } from './run.js';
import type { RetryPolicy } from './servers.js';

/** What the eval processor needs from its worker: Redis, BullMQ and the machine, as functions. */
export interface EvalJobDeps {
  jobId: string;
  workerId: string;
  /** The worker's config: datasets, tokenizer, train steps (its `eval` section is the job's). */
  config: Config;
  loadTokenizer(config: EvalRunConfig): Promise<ChatTokenizer>;
  probeGpus(): Promise<GpuProbe>;
  allowedGpus?: readonly number[];
  /** The train job's return value. */
  childResult(): Promise<unknown>;
  /** Writes fields of the run's eval status (and the `eval` phase when `phase` is given). */
  setStatus(
    fields: Record<string, string | number>,
    phase?: 'pending' | 'in_progress' | 'completed' | 'failed',
  ): Promise<void>;
  recordReport(report: EvalReport): Promise<void>;
  isCancelled(): Promise<boolean>;
  jobLog(line: string): void;
  /** Aborted when the worker stops: the servers are stopped too, the job handed back. */
  shutdown: AbortSignal;
  logger: Logger;
  retry?: RetryPolicy;
  /** How often the cancel flag is read while measuring (ms). Default 500. */
  cancelPollMs?: number;
}

/** The processor's outcome: done, not startable yet (GPU memory), or handed back (the worker stops). */
export type EvalOutcome =
  { kind: 'done'; result: EvalJobResult } | { kind: 'wait'; reason: string } | { kind: 'requeue'; reason: string };

/** The verdict is below a threshold: the job fails (never retried), its report written. */
export class EvalVerdictError extends AppError {}

/** The job was cancelled (`tokenmill train --cancel`). */
export class EvalCancelledError extends AppError {}

/** Runs one eval job (see the module comment). */
export async function processEvalJob(data: unknown, deps: EvalJobDeps): Promise<EvalOutcome> {
  const p = parsePayload(EvalJobPayloadSchema, data, 'eval');
  const started = Date.now();
  if (deps.config.run !== p.run)
    throw new AppError(`eval job ${deps.jobId} is of run ${p.run}, but this worker serves run ${deps.config.run}`);
  const skipped = async (reason: string): Promise<EvalOutcome> => {
    await deps.setStatus({ state: 'skipped', reason, attempt: '' });
    deps.jobLog(`skipped: ${reason}`);
    return {
      kind: 'done',
      result: {
        status: 'skipped',
        attempt: null,
        drafter: null,
        report: null,
        acceptLength: null,
        speedup: null,
        warnings: [],
        durationMs: Date.now() - started,
        reason,
      },
    };
  };
  if (await deps.isCancelled())
    throw new EvalCancelledError('cancelled by `tokenmill train --cancel` before it started');
  const child = (await deps.childResult()) as { status?: unknown; attempt?: unknown; reason?: unknown } | undefined;
  if (child === undefined) return skipped(`the training ${p.trainJob} left no result (removed or cancelled)`);
  if (child.status !== 'completed' || typeof child.attempt !== 'string')
    return skipped(
      `training ${p.trainJob} made no new attempt${typeof child.reason === 'string' ? `: ${child.reason}` : ''}`,
    );
  const config = { ...deps.config, eval: p.eval } as EvalConfigured;
  const drafter = await chooseDrafter(config, p.runDir, { attempt: child.attempt });
  const attemptDir = drafter.attemptDir ?? path.join(p.runDir, 'train', child.attempt);
  await deps.setStatus(
    {
      state: 'running',
      attempt: drafter.attempt ?? '',
      drafter: drafter.path,
      worker: deps.workerId,
      host: hostname(),
      detail: 'starting',
      waiting: '',
      reason: '',
    },
    'in_progress',
  );
  deps.jobLog(`evaluating ${drafter.what}: ${drafter.path}`);

  // Stopped by the worker's shutdown or by --cancel: the measurement and the servers with it.
  const stop = new AbortController();
  let stopping: 'cancel' | 'shutdown' | null = null;
  const onShutdown = (): void => {
    stopping ??= 'shutdown';
    stop.abort();
  };
  deps.shutdown.addEventListener('abort', onShutdown, { once: true });
  if (deps.shutdown.aborted) onShutdown();
  const poll = setInterval(() => {
    void deps.isCancelled().then(
      (c) => {
        if (c && stopping === null) {
          stopping = 'cancel';
          stop.abort();
        }
      },
      () => undefined,
    );
  }, deps.cancelPollMs ?? 500);
  let status: Promise<void> = Promise.resolve();
  const progress = (line: string): void => {
    deps.jobLog(line);
    const detail = line.replace(/^eval: /, '');
    status = status.then(() => deps.setStatus({ detail })).catch(() => undefined);
  };
  let measured;
  try {
    measured = await measureDrafter(config, p.runDir, drafter, {
      loadTokenizer: deps.loadTokenizer,
      probeGpus: deps.probeGpus,
      ...(deps.allowedGpus === undefined ? {} : { allowedGpus: deps.allowedGpus }),
      logDir: attemptDir,
      signal: stop.signal,
      ...(deps.retry === undefined ? {} : { retry: deps.retry }),
      onProgress: progress,
      onServers: (servers) => {
        status = status
          .then(() =>
            deps.setStatus({
              servers: servers.map((s) => `${s.role} ${s.url} pid ${s.pid ?? '?'}`).join('\n'),
              // Who each pid is, so that a later worker kills only these processes (left-groups.ts).
              serverGroups: servers
                .map((s) => recordedIdentity(s.pid))
                .filter((l) => l !== '')
                .join('\n'),
            }),
          )
          .catch(() => undefined);
      },
    });
  } catch (e: unknown) {
    if (stopping === 'cancel')
      throw new EvalCancelledError(
        `cancelled by \`tokenmill train --cancel\` during the eval of attempt ${drafter.attempt ?? '?'}`,
      );
    if (stopping === 'shutdown' && (e instanceof CancelledError || stop.signal.aborted))
      return {
        kind: 'requeue',
        reason: `the train worker stopped during the eval of attempt ${drafter.attempt ?? '?'}; another worker runs it`,
      };
    throw e;
  } finally {
    clearInterval(poll);
    deps.shutdown.removeEventListener('abort', onShutdown);
    await status;
  }
  if (measured.kind === 'wait') {
    await deps.setStatus({ state: 'waiting', waiting: measured.reason }, 'pending');
    return { kind: 'wait', reason: measured.reason };
  }
  const report = measured.report;
  const files = await writeEvalReport(report, drafter, undefined);
  await deps.recordReport(report);
  const file = files[0] ?? evalReportPath(attemptDir);
  const o = report.overall;
  const figures = `accept len ${o.drafter.acceptLength?.toFixed(2) ?? '-'}, speed-up ${o.speedup === null ? '-' : `${o.speedup.toFixed(2)}x`}`;
  for (const w of report.warnings) deps.jobLog(`WARNING: ${w}`);
  for (const f of report.failed) deps.jobLog(`FAILED: ${f.message}`);
  deps.jobLog(`report ${file}: ${figures}`);
  if (!report.ok) {
    const reason = `attempt ${report.attempt ?? '?'}: ${report.failed.map((f) => f.message).join('; ')} (report ${file})`;
    await deps.setStatus({ state: 'failed', reason, detail: figures, servers: '' }, 'failed');
    throw new EvalVerdictError(`eval ${reason}`);
  }
  await deps.setStatus(
    { state: 'completed', detail: figures, servers: '', finishedAt: new Date().toISOString() },
    'completed',
  );
  return {
    kind: 'done',
    result: {
      status: 'completed',
      attempt: report.attempt,
      drafter: report.drafter,
      report: file,
      acceptLength: o.drafter.acceptLength ?? null,
      speedup: o.speedup,
      warnings: report.warnings,
      durationMs: Date.now() - started,
    },
  };
}
