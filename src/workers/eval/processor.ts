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
  EvalJobPayloadSchema,
  parsePayload,
  type ChatTokenizer,
  type Config,
  type EvalJobPayload,
  type EvalJobResult,
} from '../../shared/index.js';
import {
  JobCancelledError,
  recordedIdentity,
  runGpuJob,
  type GpuInfo,
  type GpuJobDeps,
  type GpuJobOutcome,
  type GpuJobPhases,
  type Next,
  type StopSignal,
  type Watched,
} from '../gpu/index.js';
import { chooseDrafter, evalReportPath, type DrafterChoice } from './drafter.js';
import { serverPreflight } from './launch.js';
import { measureDrafter, type MeasureOutcome } from './measure.js';
import type { EvalReport } from './report.js';
import { writeEvalReport, type EvalConfigured, type EvalRunConfig } from './run.js';
import type { StartedServer } from './server-process.js';
import type { RetryPolicy } from './servers.js';

/** What the eval processor needs from its worker besides what every GPU job does. */
export interface EvalJobDeps extends GpuJobDeps {
  /** The worker's config: datasets, tokenizer, train steps (its `eval` section is the job's). */
  config: Config;
  loadTokenizer(config: EvalRunConfig): Promise<ChatTokenizer>;
  recordReport(report: EvalReport): Promise<void>;
  retry?: RetryPolicy;
}

/** The processor's outcome: done, not startable yet (GPU memory), or handed back (the worker stops). */
export type EvalOutcome = GpuJobOutcome<EvalJobResult>;

/** The verdict is below a threshold: the job fails (never retried), its report written. */
export class EvalVerdictError extends AppError {}

/** The eval job was cancelled (`tokenmill train --cancel`). Never retried. */
export class EvalCancelledError extends JobCancelledError {}

/** Runs one eval job (see the module comment). */
export async function processEvalJob(data: unknown, deps: EvalJobDeps): Promise<EvalOutcome> {
  const p = parsePayload(EvalJobPayloadSchema, data, 'eval');
  if (deps.config.run !== p.run)
    throw new AppError(`eval job ${deps.jobId} is of run ${p.run}, but this worker serves run ${deps.config.run}`);
  return runGpuJob(deps, new EvalJob(p, deps));
}

/** The drafter an eval job measures, and the config it measures with. */
interface Chosen {
  config: EvalConfigured;
  drafter: DrafterChoice;
  attemptDir: string;
}

/** What preflight chose: the drafter, and the GPUs of the servers `eval.server` starts (none without). */
interface Ready extends Chosen {
  assigned: readonly GpuInfo[] | undefined;
}

/** The phases of one eval job (see the module comment). */
class EvalJob implements GpuJobPhases<Chosen, Ready, MeasureOutcome, EvalJobResult> {
  private readonly started = Date.now();

  constructor(
    private readonly p: EvalJobPayload,
    private readonly deps: EvalJobDeps,
  ) {}

  cancelled(message: string): Error {
    return new EvalCancelledError(message);
  }

  /** The training's attempt and its drafter; a training that made no new attempt is skipped. */
  async prepare(): Promise<Next<Chosen, EvalJobResult>> {
    const p = this.p;
    const child = (await this.deps.childResult()) as
      { status?: unknown; attempt?: unknown; reason?: unknown } | undefined;
    if (child === undefined) return this.skipped(`the training ${p.trainJob} left no result (removed or cancelled)`);
    if (child.status !== 'completed' || typeof child.attempt !== 'string')
      return this.skipped(
        `training ${p.trainJob} made no new attempt${typeof child.reason === 'string' ? `: ${child.reason}` : ''}`,
      );
    const config: EvalConfigured = { ...this.deps.config, eval: p.eval };
    const drafter = await chooseDrafter(config, p.runDir, { attempt: child.attempt });
    const attemptDir = drafter.attemptDir ?? path.join(p.runDir, 'train', child.attempt);
    return { kind: 'go', value: { config, drafter, attemptDir } };
  }

  /** The servers `eval.server` starts get their GPUs with enough free memory, or the job waits. */
  async preflight(chosen: Chosen): Promise<Next<Ready, EvalJobResult>> {
    const { deps } = this;
    const { drafter } = chosen;
    const running = { attempt: drafter.attempt ?? '', drafter: drafter.path, worker: deps.workerId, host: hostname() };
    deps.jobLog(`evaluating ${drafter.what}: ${drafter.path}`);
    const server = chosen.config.eval.server;
    let assigned: readonly GpuInfo[] | undefined;
    if (server !== undefined) {
      const verdict = serverPreflight(server, await deps.probeGpus(), deps.allowedGpus);
      if (!verdict.ok) return this.waiting(verdict.reason, running);
      assigned = verdict.assigned;
    }
    await deps.setStatus({ state: 'running', ...running, detail: 'starting', waiting: '', reason: '' }, 'in_progress');
    return { kind: 'go', value: { ...chosen, assigned } };
  }

  /** The measurement (the servers started and stopped with it), its progress and servers in the status. */
  async run(ready: Ready, stop: StopSignal): Promise<MeasureOutcome> {
    const deps = this.deps;
    let status: Promise<void> = Promise.resolve();
    const write = (fields: Record<string, string>): void => {
      status = status.then(() => deps.setStatus(fields)).catch(() => undefined);
    };
    try {
      return await measureDrafter(ready.config, this.p.runDir, ready.drafter, {
        loadTokenizer: deps.loadTokenizer,
        probeGpus: deps.probeGpus,
        ...(deps.allowedGpus === undefined ? {} : { allowedGpus: deps.allowedGpus }),
        ...(ready.assigned === undefined ? {} : { assigned: ready.assigned }),
        logDir: ready.attemptDir,
        signal: stop.signal,
        ...(deps.retry === undefined ? {} : { retry: deps.retry }),
        onProgress: (line) => {
          deps.jobLog(line);
          write({ detail: line.replace(/^eval: /, '') });
        },
        onServers: (servers) => write(serversStatus(servers)),
      });
    } finally {
      await status;
    }
  }

  /** Stopped (cancelled: thrown; the worker's shutdown: handed back), waiting, or the report and its verdict. */
  async finish(ready: Ready, watched: Watched<MeasureOutcome>): Promise<EvalOutcome> {
    const of = `the eval of attempt ${ready.drafter.attempt ?? '?'}`;
    if (!watched.ok) {
      if (watched.stopping === 'cancel')
        throw new EvalCancelledError(`cancelled by \`tokenmill train --cancel\` during ${of}`);
      if (watched.stopping === 'shutdown') {
        const reason = `the train worker stopped during ${of}; another worker runs it`;
        await this.deps.setStatus({ state: 'queued', detail: reason });
        return { kind: 'requeue', reason };
      }
      throw watched.error;
    }
    const measured = watched.value;
    if (measured.kind === 'wait') return this.waiting(measured.reason, {});
    return this.verdict(measured.report, ready);
  }

  /** The report written and recorded; below a threshold the job fails, else it completes. */
  private async verdict(report: EvalReport, ready: Ready): Promise<EvalOutcome> {
    const deps = this.deps;
    const files = await writeEvalReport(report, ready.drafter, undefined);
    await deps.recordReport(report);
    const file = files[0] ?? evalReportPath(ready.attemptDir);
    const o = report.overall;
    const figures = `${report.source === 'simulator' ? 'simulated: ' : ''}accept len ${o.drafter.acceptLength?.toFixed(2) ?? '-'}, speed-up ${o.speedup === null ? '-' : `${o.speedup.toFixed(2)}x`}`;
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
    const result: EvalJobResult = {
      status: 'completed',
      attempt: report.attempt,
      drafter: report.drafter,
      report: file,
      acceptLength: o.drafter.acceptLength ?? null,
      speedup: o.speedup,
      warnings: report.warnings,
      durationMs: Date.now() - this.started,
    };
    return { kind: 'done', result };
  }

  private async waiting(reason: string, fields: Record<string, string>): Promise<EvalOutcome> {
    await this.deps.setStatus({ state: 'waiting', ...fields, waiting: reason }, 'pending');
    return { kind: 'wait', reason };
  }

  private async skipped(reason: string): Promise<EvalOutcome> {
    await this.deps.setStatus({ state: 'skipped', reason, attempt: '' });
    this.deps.jobLog(`skipped: ${reason}`);
    const result: EvalJobResult = {
      status: 'skipped',
      attempt: null,
      drafter: null,
      report: null,
      acceptLength: null,
      speedup: null,
      warnings: [],
      durationMs: Date.now() - this.started,
      reason,
    };
    return { kind: 'done', result };
  }
}

/** The servers as the status shows them, and who each pid is, so that a later worker kills only these processes. */
function serversStatus(servers: readonly StartedServer[]): Record<string, string> {
  return {
    servers: servers.map((s) => `${s.role} ${s.url} pid ${s.pid ?? '?'}`).join('\n'),
    serverGroups: servers
      .map((s) => recordedIdentity(s.pid))
      .filter((l) => l !== '')
      .join('\n'),
  };
}
