/**
 * `eval.server`: the drafter server (and the baseline server) the eval step starts for the
 * attempt it evaluates. The GPU preflight is the train steps' (enough GPUs with enough free
 * memory, or wait); each server gets its own GPUs (`CUDA_VISIBLE_DEVICES`), its placeholders
 * filled in, and a log file in the attempt folder; both are stopped after the measurement,
 * whatever happened.
 */
import path from 'node:path';
import { AppError, type Config } from '../../shared/index.js';
import { preflight, type GpuInfo, type GpuProbe, type PreflightVerdict } from '../gpu/index.js';
import type { DrafterChoice } from './drafter.js';
import type { EvalConfigured } from './run.js';
import { startServer, type ServerRole, type StartedServer } from './server-process.js';

/** `eval.server` of a config that has it. */
export type EvalServerSettings = NonNullable<NonNullable<Config['eval']>['server']>;

/** Values of a server command's placeholders. */
export interface ServerValues {
  /** The drafter evaluated (`{checkpoint}`). */
  checkpoint: string;
  /** The attempt folder, for `{output:<step>}`; null for `--checkpoint`. */
  attemptDir: string | null;
  port: number;
  gpus: number;
}

const PLACEHOLDER = /\{(checkpoint|port|gpus|output:[^}]+)\}/g;

/**
 * `command` with `{checkpoint}`, `{port}`, `{gpus}` and `{output:<step>}` (that step's output
 * folder in the attempt, a step of `train.steps`) replaced.
 */
export function serverArgv(
  command: readonly string[],
  v: ServerValues,
  steps: readonly { name: string }[] | undefined,
  key: string,
): string[] {
  return command.map((a) =>
    a.replace(PLACEHOLDER, (_m, name: string) => {
      if (name === 'checkpoint') return v.checkpoint;
      if (name === 'port') return String(v.port);
      if (name === 'gpus') return String(v.gpus);
      const step = name.slice('output:'.length);
      const names = (steps ?? []).map((s) => s.name);
      if (!names.includes(step))
        throw new AppError(
          `${key}: {output:${step}} names no step of train.steps (${names.length === 0 ? 'none' : names.join(', ')})`,
        );
      if (v.attemptDir === null)
        throw new AppError(`${key}: {output:${step}} needs an attempt; with --checkpoint there is none`);
      return path.join(v.attemptDir, step, 'output');
    }),
  );
}

/** What starting the servers needs from its caller. */
export interface LaunchOptions {
  /** GPU discovery (`nvidia-smi`). */
  probeGpus(): Promise<GpuProbe>;
  /** GPU indices this worker may use; all when omitted. */
  allowedGpus?: readonly number[];
  /** The GPUs the caller's {@link serverPreflight} assigned: no second preflight. */
  assigned?: readonly GpuInfo[];
  /** Folder of the servers' logs (`eval-server-<role>.log`). */
  logDir: string;
  /** Aborts the start: the servers are stopped. */
  signal?: AbortSignal;
  /** Each line a server writes, with its role. */
  onLine?: (role: ServerRole, line: string) => void;
  /** How often health is asked (ms); default 500. */
  pollMs?: number;
}

/** Started servers: the endpoints to measure on, and how to stop them. */
export interface LaunchedServers {
  endpoints: string[];
  baseline: string[] | undefined;
  servers: StartedServer[];
  /** The GPUs each server got. */
  gpus: Record<ServerRole, number[]>;
  stop(): Promise<void>;
}

/** The preflight said wait (too few GPUs, too little free memory), or the servers run. */
export type LaunchOutcome =
  { kind: 'wait'; reason: string; seen: GpuInfo[] } | { kind: 'started'; launched: LaunchedServers };

/** The roles `eval.server` starts: the drafter's server, and the baseline's with `baselineCommand`. */
function rolesOf(s: EvalServerSettings): ServerRole[] {
  return s.baselineCommand === undefined ? ['drafter'] : ['drafter', 'baseline'];
}

/**
 * The GPU preflight of `eval.server`'s servers (the train steps' rule): `server.gpus` for each
 * server, each with `server.minFreeGpuMemMiB` free; the reason of a wait names the servers.
 */
export function serverPreflight(
  s: EvalServerSettings,
  probe: GpuProbe,
  allowed: readonly number[] | undefined,
): PreflightVerdict {
  const verdict = preflight({ gpus: s.gpus * rolesOf(s).length, minFreeGpuMemMiB: s.minFreeGpuMemMiB }, probe, allowed);
  return verdict.ok ? verdict : { ...verdict, reason: `eval servers: ${verdict.reason}` };
}

/**
 * Starts `eval.server`'s servers for `drafter`, both at once (each on its own GPUs), and waits
 * until each is healthy. When one fails, the other is stopped and the error is the failure's.
 */
export async function launchEvalServers(
  config: EvalConfigured,
  drafter: Pick<DrafterChoice, 'path' | 'attemptDir'>,
  o: LaunchOptions,
): Promise<LaunchOutcome> {
  const s = config.eval.server;
  if (s === undefined) throw new AppError('eval: no eval.server to start');
  const roles = rolesOf(s);
  let assigned = o.assigned;
  if (assigned === undefined) {
    const verdict = serverPreflight(s, await o.probeGpus(), o.allowedGpus);
    if (!verdict.ok) return { kind: 'wait', reason: verdict.reason, seen: verdict.seen };
    assigned = verdict.assigned;
  }
  const chosen = assigned;
  const gpusOf = (i: number): number[] => chosen.slice(i * s.gpus, (i + 1) * s.gpus).map((g) => g.index);
  const gpus: Record<ServerRole, number[]> = { drafter: gpusOf(0), baseline: roles.length > 1 ? gpusOf(1) : [] };
  const specOf = (role: ServerRole) => {
    const port = role === 'drafter' ? s.port : s.baselinePort;
    const key = `eval.server.${role === 'drafter' ? 'command' : 'baselineCommand'}`;
    const command = role === 'drafter' ? s.command : (s.baselineCommand ?? []);
    return {
      role,
      argv: serverArgv(
        command,
        { checkpoint: drafter.path, attemptDir: drafter.attemptDir, port, gpus: gpus[role].length },
        config.train?.steps,
        key,
      ),
      cwd: config.source.baseDir,
      env: { ...process.env, CUDA_VISIBLE_DEVICES: gpus[role].join(','), PYTHONUNBUFFERED: '1' },
      port,
      portKey: `eval.server.${role === 'drafter' ? 'port' : 'baselinePort'}`,
      logFile: path.join(o.logDir, `eval-server-${role}.log`),
      healthTimeoutMs: s.healthTimeoutMs,
      stopGraceMs: s.stopGraceMs,
    };
  };
  const specs = roles.map(specOf);
  if (s.baselineCommand !== undefined && s.port === s.baselinePort)
    throw new AppError(`eval.server: port and baselinePort are both ${s.port}; the two servers need a port each`);
  // One failing stops the others' start at once (they are stopped, not waited for).
  const abort = new AbortController();
  const onOuter = (): void => abort.abort();
  o.signal?.addEventListener('abort', onOuter, { once: true });
  if (o.signal?.aborted === true) abort.abort();
  let first: unknown;
  const settled = await Promise.allSettled(
    specs.map((spec) =>
      startServer(spec, {
        signal: abort.signal,
        ...(o.onLine === undefined ? {} : { onLine: (line: string) => o.onLine?.(spec.role, line) }),
        ...(o.pollMs === undefined ? {} : { pollMs: o.pollMs }),
      }).catch((e: unknown) => {
        first ??= e;
        abort.abort();
        throw e;
      }),
    ),
  ).finally(() => o.signal?.removeEventListener('abort', onOuter));
  const servers = settled.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const stop = async (): Promise<void> => {
    await Promise.all(servers.map((x) => x.stop()));
  };
  if (settled.some((r) => r.status === 'rejected')) {
    await stop();
    throw first;
  }
  const url = (role: ServerRole): string | undefined => servers.find((x) => x.role === role)?.url;
  const baseline = url('baseline');
  return {
    kind: 'started',
    launched: {
      endpoints: [url('drafter') ?? ''],
      baseline: baseline === undefined ? undefined : [baseline],
      servers,
      gpus,
      stop,
    },
  };
}
