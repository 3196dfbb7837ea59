/**
 * `tokenmill eval` end to end, without the command line: the servers checked, the prompts
 * rendered, per dataset the drafter phase then the baseline phase (one after the other, so they
 * never share the GPUs' time), and the report built, compared with the previous attempt's and
 * written atomically.
 */
import {
  jsonText,
  SglangClient,
  writeFileAtomic,
  type ChatTokenizer,
  type Config,
  type GenerateResult,
} from '../../shared/index.js';
import type { DrafterChoice } from './drafter.js';
import { evalReportPath, previousReport } from './drafter.js';
import { type EvalPhase, runPhase, WARMUP_NEW_TOKENS } from './phase.js';
import { loadPromptSets } from './prompts.js';
import {
  buildReport,
  type BaselineEndpointInfo,
  type DatasetTotals,
  type DrafterEndpointInfo,
  type EvalReport,
  type EvalSettings,
} from './report.js';
import {
  checkBaselineEndpoint,
  checkDrafterEndpoint,
  commonTarget,
  EvalError,
  fetchServerInfo,
  type RetryPolicy,
} from './servers.js';

/** A config with its `eval` section. */
export type EvalConfigured = Config & { eval: NonNullable<Config['eval']> };

/** A config with its `eval` section and the endpoints to measure on (given, or started by `eval.server`). */
export type EvalRunConfig = EvalConfigured & { eval: { endpoints: string[] } };

/** The config with its `eval` section, or an EvalError saying it is missing. */
export function evalSectionOf(config: Config): EvalConfigured {
  if (config.eval === undefined)
    throw new EvalError(
      `eval: the config${config.source.file === undefined ? '' : ` ${config.source.file}`} has no eval section: set eval.endpoints (SGLang servers with the drafter) and, to measure the speed-up, eval.baseline; or eval.server to have them started`,
    );
  return config as EvalConfigured;
}

/** The config's `eval` section with its endpoints, or an EvalError saying what is missing. */
export function evalConfigOf(config: Config): EvalRunConfig {
  const c = evalSectionOf(config);
  if (c.eval.endpoints === undefined)
    throw new EvalError('eval: eval.server starts the endpoints: they are known only once the servers run');
  return c as EvalRunConfig;
}

/** The config measuring on `endpoints` and `baseline` (the servers `eval.server` started). */
export function withEndpoints(
  config: EvalConfigured,
  endpoints: readonly string[],
  baseline: readonly string[] | undefined,
): EvalRunConfig {
  const e: EvalRunConfig['eval'] = { ...config.eval, endpoints: [...endpoints] };
  delete e.baseline;
  if (baseline !== undefined) e.baseline = [...baseline];
  return { ...config, eval: e };
}

/** What the servers said, once every refusal check passed. */
export interface CheckedServers {
  endpoints: DrafterEndpointInfo[];
  baseline: BaselineEndpointInfo[] | null;
  /** The context length prompts must fit: `sglang.contextLength`, else the drafter endpoints' own. */
  contextLength: number | undefined;
}

/**
 * Asks every endpoint's `/server_info` and refuses what would measure the wrong thing (see
 * servers.ts). Throws an EvalError naming the first endpoint at fault.
 */
export async function checkServers(
  config: EvalRunConfig,
  drafter: Pick<DrafterChoice, 'path' | 'what'>,
  retry?: RetryPolicy,
): Promise<CheckedServers> {
  const apiKey = config.sglang.apiKey;
  const e = config.eval;
  const infos = await Promise.all(e.endpoints.map((u) => fetchServerInfo(u, apiKey, retry)));
  const endpoints: DrafterEndpointInfo[] = [];
  for (const [i, url] of e.endpoints.entries()) {
    const info = infos[i];
    if (info !== undefined) endpoints.push(await checkDrafterEndpoint(url, info, drafter));
  }
  const target = commonTarget(endpoints);
  let baseline: BaselineEndpointInfo[] | null = null;
  if (e.baseline !== undefined) {
    const bInfos = await Promise.all(e.baseline.map((u) => fetchServerInfo(u, apiKey, retry)));
    baseline = e.baseline.map((url, i) => checkBaselineEndpoint(url, bInfos[i] ?? {}, target));
  }
  let contextLength = config.sglang.contextLength;
  for (const info of infos) {
    if (contextLength !== undefined) break;
    if (typeof info.context_length === 'number') contextLength = info.context_length;
    else if (typeof info.max_req_input_len === 'number' && info.max_req_input_len > 0)
      contextLength = info.max_req_input_len;
  }
  return { endpoints, baseline, contextLength };
}

/** What {@link runEval} needs. */
export interface EvalRunOptions {
  config: EvalRunConfig;
  runDir: string;
  drafter: DrafterChoice;
  /** The run's tokenizer, loaded once the servers passed their checks. */
  loadTokenizer: (servers: CheckedServers) => Promise<ChatTokenizer>;
  retry?: RetryPolicy;
  signal?: AbortSignal;
  /** Progress for people, a line at a time. */
  onProgress?: (line: string) => void;
  /** Told every answer (phase, rid, endpoint, answer). */
  onAnswer?: (phase: EvalPhase, rid: string, endpoint: string, answer: GenerateResult) => void;
}

function clientsFor(urls: readonly string[], config: EvalRunConfig, perEndpoint: number): SglangClient[] {
  return urls.map(
    (endpoint) =>
      new SglangClient({
        endpoint,
        concurrency: perEndpoint,
        requestTimeoutMs: config.eval.requestTimeoutMs,
        ...(config.sglang.apiKey === undefined ? {} : { apiKey: config.sglang.apiKey }),
      }),
  );
}

/** The settings a report records, for comparing reports. */
export function settingsOf(config: EvalRunConfig): EvalSettings {
  const e = config.eval;
  return {
    concurrency: e.concurrency,
    maxNewTokens: e.maxNewTokens,
    sampling: e.sampling === 'dataset' ? 'dataset' : { ...e.sampling },
    maxPromptsPerDataset: e.maxPromptsPerDataset,
    prompts: e.prompts ?? 'held-out',
  };
}

/** Measures the drafter and returns the report (not yet written). */
export async function runEval(o: EvalRunOptions): Promise<EvalReport> {
  const { config } = o;
  const e = config.eval;
  const startedMs = Date.now();
  const say = o.onProgress ?? (() => undefined);
  const servers = await checkServers(config, o.drafter, o.retry);
  const tokenizer = await o.loadTokenizer(servers);
  const { sets, skipped } = await loadPromptSets(config, o.runDir, tokenizer, servers.contextLength);
  const usable = sets.filter((s) => s.prompts.length > 0);
  for (const s of sets) {
    if (s.rejected.length > 0)
      say(
        `eval: ${s.dataset}: ${s.rejected.length} lines of ${s.file} left out (first: line ${s.rejected[0]?.line}: ${s.rejected[0]?.reason})`,
      );
    if (s.prompts.length === 0) skipped.push({ dataset: s.dataset, reason: `no usable prompt in ${s.file}` });
  }
  if (usable.length === 0)
    throw new EvalError(
      `eval: no prompts to evaluate on: ${skipped.map((s) => `${s.dataset}: ${s.reason}`).join('; ') || 'no dataset'}; set eval.prompts, or datasets[].evalHoldout and run the pipeline`,
    );
  const [warmupIds] = await tokenizer.encodePrompts([[{ role: 'user', content: 'Warm-up: say hello.' }]]);
  const warmup = Array.isArray(warmupIds) ? { inputIds: warmupIds, maxNewTokens: WARMUP_NEW_TOKENS } : undefined;
  const perEndpoint = (n: number): number => Math.max(1, Math.ceil(e.concurrency / n));
  const drafterClients = clientsFor(e.endpoints, config, perEndpoint(e.endpoints.length));
  const baselineClients =
    e.baseline === undefined ? [] : clientsFor(e.baseline, config, perEndpoint(e.baseline.length));
  const totals: DatasetTotals[] = [];
  try {
    for (const set of usable) {
      const phase = async (p: EvalPhase, clients: SglangClient[]) => {
        say(`eval: ${set.dataset}: ${p}, ${set.prompts.length} prompts, ${e.concurrency} in flight`);
        return runPhase({
          phase: p,
          clients,
          set,
          concurrency: e.concurrency,
          ...(warmup === undefined ? {} : { warmup }),
          ...(o.retry === undefined ? {} : { retry: o.retry }),
          ...(o.signal === undefined ? {} : { signal: o.signal }),
          ...(o.onAnswer === undefined
            ? {}
            : { onAnswer: (rid: string, ep: string, a: GenerateResult) => o.onAnswer?.(p, rid, ep, a) }),
        });
      };
      const drafter = await phase('drafter', drafterClients);
      const baseline = baselineClients.length === 0 ? null : await phase('baseline', baselineClients);
      totals.push({ dataset: set.dataset, promptFile: set.file, prompts: set.prompts.length, drafter, baseline });
    }
  } finally {
    await Promise.all([...drafterClients, ...baselineClients].map((c) => c.close()));
  }
  const prev = await previousReport(o.runDir, o.drafter.attempt);
  for (const n of prev.notes) say(`eval: ${n}`);
  return buildReport(totals, {
    run: config.run,
    attempt: o.drafter.attempt,
    drafter: o.drafter.path,
    measuredAt: new Date(startedMs).toISOString(),
    durationSec: (Date.now() - startedMs) / 1000,
    endpoints: servers.endpoints,
    baseline: servers.baseline,
    settings: settingsOf(config),
    skipped,
    previous: prev.found,
    thresholds: {
      minAcceptLength: e.minAcceptLength,
      minSpeedup: e.minSpeedup,
      maxAcceptDrop: e.maxAcceptDrop,
    },
  });
}

/**
 * Writes the report atomically: to `<attempt>/eval.json` when an attempt was evaluated, and to
 * `out` when given. Returns the files written.
 */
export async function writeEvalReport(
  report: EvalReport,
  drafter: Pick<DrafterChoice, 'attemptDir'>,
  out: string | undefined,
): Promise<string[]> {
  const files = [
    ...(drafter.attemptDir === null ? [] : [evalReportPath(drafter.attemptDir)]),
    ...(out === undefined ? [] : [out]),
  ];
  for (const f of files) await writeFileAtomic(f, jsonText(report));
  return files;
}
