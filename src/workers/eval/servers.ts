/**
 * What the evaluation's servers serve, from their `/server_info`, and the refusals that keep
 * `tokenmill eval` from measuring the wrong thing: a drafter endpoint without speculative
 * decoding or with another drafter than the one evaluated, a baseline with speculation or with
 * another target model.
 */
import { realpath } from 'node:fs/promises';
import path from 'node:path';
import {
  AppError,
  errorMessage,
  isRecord,
  SglangClient,
  TimeoutError,
  UnavailableError,
  type ServerInfo,
} from '../../shared/index.js';
import type { BaselineEndpointInfo, DrafterEndpointInfo, SimulatorInfo } from './report.js';

/** Why `tokenmill eval` will not measure, or could not: one line naming the endpoint or file. */
export class EvalError extends AppError {}

/** How often, and how patiently, an unreachable endpoint is tried again. */
export interface RetryPolicy {
  /** Tries in all (the first included). */
  attempts: number;
  /** Wait before the second try (ms); doubled before each later one. */
  backoffMs: number;
  /** Longest wait between two tries (ms). */
  maxBackoffMs: number;
}

/** 5 tries over about 7.5 s. */
export const DEFAULT_RETRY: RetryPolicy = { attempts: 5, backoffMs: 500, maxBackoffMs: 4_000 };

/** Whether an error means the endpoint could not be reached (worth another try). */
export function isUnreachable(e: unknown): boolean {
  return e instanceof UnavailableError;
}

/**
 * Runs `fn`, trying again with backoff while the endpoint cannot be reached; then fails with
 * one line naming the endpoint, what was asked, and how long it was tried.
 */
export async function withConnectRetries<T>(
  endpoint: string,
  what: string,
  fn: () => Promise<T>,
  policy: RetryPolicy = DEFAULT_RETRY,
  signal?: AbortSignal,
): Promise<T> {
  const started = Date.now();
  let wait = policy.backoffMs;
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (e: unknown) {
      const retry = isUnreachable(e) || (e instanceof TimeoutError && what !== 'POST /generate');
      if (!retry || signal?.aborted === true) throw e;
      if (attempt >= policy.attempts)
        throw new EvalError(
          `eval: endpoint ${endpoint} is down: ${what} failed ${attempt} times over ${((Date.now() - started) / 1000).toFixed(1)} s (${errorMessage(e)})`,
          { cause: e },
        );
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(wait * 2, policy.maxBackoffMs);
    }
  }
}

const str = (v: unknown): string | null => (typeof v === 'string' && v !== '' ? v : null);
const int = (v: unknown): number | null => (Number.isSafeInteger(v) ? (v as number) : null);

/**
 * The `/server_info` key under which tokenmill's simulator announces itself (src/sim/announce.ts);
 * real SGLang sends no key that starts with `tokenmill`.
 */
export const SIMULATOR_ANNOUNCEMENT_KEY = 'tokenmill_simulator';

const finite = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/**
 * What a server's simulator announcement says, or null when it made none (SGLang). An
 * announcement present but unreadable still says "simulator", with its figures unknown.
 */
export function simulatorOf(info: ServerInfo): SimulatorInfo | null {
  const a: unknown = info[SIMULATOR_ANNOUNCEMENT_KEY];
  if (a === undefined || a === null || a === false) return null;
  const r = isRecord(a) ? a : {};
  const spec = isRecord(r.speculative) ? r.speculative : null;
  const perDataset: Record<string, number> = {};
  if (spec !== null && isRecord(spec.per_dataset))
    for (const [name, v] of Object.entries(spec.per_dataset)) {
      const m = isRecord(v) ? finite(v.mean_accept_length) : null;
      if (m !== null) perDataset[name] = m;
    }
  const acceptance =
    spec !== null && Array.isArray(spec.acceptance) && spec.acceptance.every((p) => finite(p) !== null)
      ? (spec.acceptance as number[])
      : null;
  return {
    imitates: str(r.imitates),
    meanAcceptLength: spec === null ? null : finite(spec.mean_accept_length),
    acceptance,
    perDataset,
    draftOverhead: spec === null ? null : finite(spec.draft_overhead),
  };
}

/** The real path of `p` when it exists here, else `p` made absolute (the server may be elsewhere). */
export async function comparablePath(p: string): Promise<string> {
  try {
    return await realpath(p);
  } catch {
    return path.resolve(p.replace(/\/+$/, ''));
  }
}

/** `/server_info` of one endpoint, tried again while it is unreachable. */
export async function fetchServerInfo(
  url: string,
  apiKey: string | undefined,
  policy?: RetryPolicy,
): Promise<ServerInfo> {
  const client = new SglangClient({
    endpoint: url,
    concurrency: 1,
    requestTimeoutMs: 10_000,
    controlTimeoutMs: 5_000,
    ...(apiKey === undefined ? {} : { apiKey }),
  });
  try {
    return await withConnectRetries(url, 'GET /server_info', () => client.serverInfo(), policy);
  } finally {
    await client.destroy();
  }
}

/**
 * Checks a drafter endpoint's `/server_info`: speculative decoding on, with `drafter` (compared
 * as real paths). Throws an AppError of one line naming the endpoint otherwise.
 */
export async function checkDrafterEndpoint(
  url: string,
  info: ServerInfo,
  drafter: { path: string; what: string },
): Promise<DrafterEndpointInfo> {
  const algorithm = str(info.speculative_algorithm);
  if (algorithm === null)
    throw new EvalError(
      `eval: endpoint ${url} serves without speculative decoding (/server_info speculative_algorithm: ${JSON.stringify(info.speculative_algorithm ?? null)}); ` +
        `start it with --speculative-algorithm EAGLE3 --speculative-draft-model-path ${drafter.path}, or list it in eval.baseline`,
    );
  const served = str(info.speculative_draft_model_path);
  if (served === null)
    throw new EvalError(
      `eval: endpoint ${url} decodes speculatively (${algorithm}) but /server_info names no speculative_draft_model_path; expected ${drafter.path}`,
    );
  const [servedReal, expectedReal] = await Promise.all([comparablePath(served), comparablePath(drafter.path)]);
  if (servedReal !== expectedReal)
    throw new EvalError(
      `eval: endpoint ${url} serves the drafter ${served}${servedReal === served ? '' : ` (${servedReal})`}, not the one evaluated: ` +
        `${drafter.path}${expectedReal === drafter.path ? '' : ` (${expectedReal})`}, ${drafter.what}`,
    );
  return {
    url,
    version: str(info.version),
    modelPath: str(info.model_path),
    algorithm,
    draftModelPath: served,
    numSteps: int(info.speculative_num_steps),
    eagleTopk: int(info.speculative_eagle_topk),
    numDraftTokens: int(info.speculative_num_draft_tokens),
    blockSize: int(info.speculative_dflash_block_size),
    simulator: simulatorOf(info),
  };
}

/** Checks a baseline endpoint: no speculation, the target the drafter endpoints serve. */
export function checkBaselineEndpoint(
  url: string,
  info: ServerInfo,
  target: { modelPath: string | null; from: string },
): BaselineEndpointInfo {
  const algorithm = str(info.speculative_algorithm);
  if (algorithm !== null)
    throw new EvalError(
      `eval: baseline endpoint ${url} decodes speculatively (/server_info speculative_algorithm: ${algorithm}, drafter ${str(info.speculative_draft_model_path) ?? '?'}); ` +
        'a baseline must serve the target alone',
    );
  const modelPath = str(info.model_path);
  if (target.modelPath !== null && modelPath !== null && modelPath !== target.modelPath)
    throw new EvalError(
      `eval: baseline endpoint ${url} serves the model ${modelPath}, but ${target.from} serves ${target.modelPath}: the speed-up would compare two targets`,
    );
  return { url, version: str(info.version), modelPath, simulator: simulatorOf(info) };
}

/** Checks that every drafter endpoint serves the same target; returns it. */
export function commonTarget(endpoints: readonly DrafterEndpointInfo[]): { modelPath: string | null; from: string } {
  const first = endpoints[0];
  if (first === undefined) throw new EvalError('eval: no drafter endpoint (eval.endpoints)');
  for (const e of endpoints.slice(1))
    if (e.modelPath !== null && first.modelPath !== null && e.modelPath !== first.modelPath)
      throw new EvalError(
        `eval: endpoint ${e.url} serves the model ${e.modelPath}, but ${first.url} serves ${first.modelPath}: eval.endpoints must serve one target`,
      );
  return { modelPath: first.modelPath, from: `drafter endpoint ${first.url}` };
}
