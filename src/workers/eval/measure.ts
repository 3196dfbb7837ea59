/**
 * One evaluation of a drafter, the servers included: on `eval.endpoints` as they are, or with
 * `eval.server`, on the servers started for it (and stopped afterwards, whatever happened). Used by
 * the eval step of the train worker and by `tokenmill eval`.
 */
import { mkdir } from 'node:fs/promises';
import type { ChatTokenizer } from '../../shared/index.js';
import type { GpuInfo, GpuProbe } from '../gpu/index.js';
import type { DrafterChoice } from './drafter.js';
import { launchEvalServers } from './launch.js';
import type { EvalReport } from './report.js';
import { evalConfigOf, runEval, withEndpoints, type EvalConfigured, type EvalRunConfig } from './run.js';
import type { ServerRole, StartedServer } from './server-process.js';
import type { RetryPolicy } from './servers.js';

/** What {@link measureDrafter} needs. */
export interface MeasureOptions {
  /** The run's tokenizer for the config measured (its endpoints are the servers'). */
  loadTokenizer(config: EvalRunConfig): Promise<ChatTokenizer>;
  probeGpus(): Promise<GpuProbe>;
  allowedGpus?: readonly number[];
  /** The GPUs the caller's preflight assigned to the servers (`serverPreflight`): no second preflight. */
  assigned?: readonly GpuInfo[];
  /** Folder of the started servers' logs. */
  logDir: string;
  signal?: AbortSignal;
  retry?: RetryPolicy;
  onProgress?: (line: string) => void;
  onServerLine?: (role: ServerRole, line: string) => void;
  /** Told the servers once they are healthy. */
  onServers?: (servers: readonly StartedServer[], gpus: Record<ServerRole, number[]>) => void;
}

/** Measured, or the servers could not start yet (GPUs short of memory): why. */
export type MeasureOutcome = { kind: 'wait'; reason: string } | { kind: 'measured'; report: EvalReport };

/** Measures `drafter` (see the module comment); the report is not written here. */
export async function measureDrafter(
  config: EvalConfigured,
  runDir: string,
  drafter: DrafterChoice,
  o: MeasureOptions,
): Promise<MeasureOutcome> {
  const run = async (c: EvalRunConfig): Promise<EvalReport> =>
    runEval({
      config: c,
      runDir,
      drafter,
      loadTokenizer: () => o.loadTokenizer(c),
      ...(o.retry === undefined ? {} : { retry: o.retry }),
      ...(o.signal === undefined ? {} : { signal: o.signal }),
      ...(o.onProgress === undefined ? {} : { onProgress: o.onProgress }),
    });
  if (config.eval.server === undefined) return { kind: 'measured', report: await run(evalConfigOf(config)) };
  await mkdir(o.logDir, { recursive: true });
  const say = o.onProgress ?? (() => undefined);
  say(`eval: starting the servers of eval.server for ${drafter.path}`);
  const launched = await launchEvalServers(config, drafter, {
    probeGpus: o.probeGpus,
    ...(o.allowedGpus === undefined ? {} : { allowedGpus: o.allowedGpus }),
    ...(o.assigned === undefined ? {} : { assigned: o.assigned }),
    logDir: o.logDir,
    ...(o.signal === undefined ? {} : { signal: o.signal }),
    ...(o.onServerLine === undefined ? {} : { onLine: o.onServerLine }),
  });
  if (launched.kind === 'wait') return { kind: 'wait', reason: launched.reason };
  const l = launched.launched;
  try {
    for (const s of l.servers)
      say(
        `eval: ${s.role} server healthy at ${s.url} (pid ${s.pid ?? '?'}, ${l.gpus[s.role].length === 0 ? 'no GPU' : `GPU ${l.gpus[s.role].join(',')}`}, log ${s.logFile})`,
      );
    o.onServers?.(l.servers, l.gpus);
    return { kind: 'measured', report: await run(withEndpoints(config, l.endpoints, l.baseline)) };
  } finally {
    await l.stop();
    say('eval: servers stopped');
  }
}
