/**
 * The run's tokenizer, checked against the servers before a single prompt is tokenized.
 *
 * Prompts are tokenized here and sent to SGLang as ids, so a tokenizer that is not the served
 * model's gives it wrong ids: garbage in, and training data that looks fine. Two checks, on every
 * endpoint that answers (one that does not is left to the workers' health checks):
 *
 * - **no `tokenizer.path`**: the bundled Qwen3 tokenizer is for the simulator and the demo; an
 *   endpoint whose `/model_info` names another model is refused, with the model's name and what to
 *   set in the config;
 * - **`/tokenize` probe**: where the server has `/tokenize` (it answers 200), a fixed text is
 *   tokenized here and there; different ids are refused, naming the endpoint, the tokenizer
 *   folder and the first id that differs.
 *
 * With server-side tokenization (`tokenizer.kind: server`) the ids are the server's, but the
 * chat template is rendered here, so the template is what is checked, on every endpoint (all
 * must answer): a probe conversation rendered here and tokenized there (`/tokenize {prompt}`)
 * must give the ids of the server's own rendering (`/tokenize {messages}`, where the server
 * takes that form; a warning says when it does not), and each special token the rendering holds,
 * and each end-of-turn token, must come back from `/tokenize` as its one id of
 * `tokenizer_config.json`. Conversation datasets are refused (see `checkTokenizerKindFits`).
 */
import path from 'node:path';

import { request } from 'undici';

import {
  BUNDLED_TOKENIZER_MODEL,
  EnvironmentError,
  SglangClient,
  bundledTokenizerPath,
  checkTokenizerKindFits,
  errorMessage,
  loadConfiguredTokenizer,
  logger,
  type ChatMessage,
  type ChatTokenizer,
  type Config,
  type ServerTokenizeClient,
} from '../shared/index.js';

/** Text tokenized on both sides by the probe: Latin, digits, punctuation, Han, emoji, code. */
export const TOKENIZE_PROBE_TEXT =
  'tokenmill tokenizer probe: Hello, world! 12345 你好，世界 🙂 def f(x): return x**2\n';

/** Per request: a server that does not answer in this time is skipped, not waited for. */
const CHECK_TIMEOUT_MS = 3_000;

/** Whether a served model (its `model_path`) uses the bundled tokenizer: the simulator's default model. */
export function servesBundledModel(modelPath: string): boolean {
  const base = (p: string): string => path.posix.basename(p.replace(/\/+$/, '')).toLowerCase();
  return base(modelPath) === base(BUNDLED_TOKENIZER_MODEL);
}

/** What an endpoint says about its model and tokenizer; undefined parts it did not answer. */
interface EndpointFacts {
  endpoint: string;
  modelPath: string | undefined;
  /** The ids of {@link TOKENIZE_PROBE_TEXT}, when `/tokenize` answered 200 with a list of ids. */
  probeIds: number[] | undefined;
}

async function tokenizeOnServer(endpoint: string, apiKey: string | undefined): Promise<number[] | undefined> {
  try {
    const res = await request(new URL('/tokenize', endpoint), {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` }),
      },
      body: JSON.stringify({ prompt: TOKENIZE_PROBE_TEXT, add_special_tokens: false }),
      headersTimeout: CHECK_TIMEOUT_MS,
      bodyTimeout: CHECK_TIMEOUT_MS,
    });
    const body: unknown = await res.body.json().catch(() => undefined);
    if (res.statusCode !== 200 || body === null || typeof body !== 'object') return undefined;
    const tokens = (body as { tokens?: unknown }).tokens;
    return Array.isArray(tokens) && tokens.every((t) => Number.isInteger(t)) ? (tokens as number[]) : undefined;
  } catch {
    return undefined; // no /tokenize here (older SGLang, another server): nothing to compare
  }
}

async function endpointFacts(config: Config, endpoint: string): Promise<EndpointFacts> {
  const apiKey = config.sglang.apiKey;
  const client = new SglangClient({
    endpoint,
    concurrency: 1,
    requestTimeoutMs: CHECK_TIMEOUT_MS,
    controlTimeoutMs: CHECK_TIMEOUT_MS,
    ...(apiKey === undefined ? {} : { apiKey }),
  });
  let modelPath: string | undefined;
  try {
    modelPath = (await client.modelInfo()).model_path;
  } catch (e: unknown) {
    logger('tokenizer-check').debug(
      { endpoint, err: errorMessage(e) },
      'model info not available; model check skipped',
    );
  } finally {
    await client.close();
  }
  return {
    endpoint,
    modelPath,
    probeIds: modelPath === undefined ? undefined : await tokenizeOnServer(endpoint, apiKey),
  };
}

/** The first index where two id lists differ, or -1. */
function firstDifference(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < Math.max(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return -1;
}

/**
 * Throws an {@link EnvironmentError} when `tokenizer` is not the model's that `facts` describes
 * (see the module comment). `bundled`: no `tokenizer.path` was set.
 */
export function checkTokenizerAgainst(tokenizer: ChatTokenizer, bundled: boolean, facts: EndpointFacts): void {
  const { endpoint, modelPath, probeIds } = facts;
  if (bundled && modelPath !== undefined && !servesBundledModel(modelPath)) {
    throw new EnvironmentError(
      `${endpoint} serves the model "${modelPath}", but no tokenizer.path is set: the bundled ${BUNDLED_TOKENIZER_MODEL} tokenizer ` +
        `(for the simulator and the demo) would give that model wrong token ids. Set tokenizer: { path: <folder of ${modelPath}, ` +
        'with its tokenizer.json and tokenizer_config.json> } in the config',
    );
  }
  if (probeIds === undefined) return;
  const local = tokenizer.encode(TOKENIZE_PROBE_TEXT);
  const at = firstDifference(local, probeIds);
  if (at >= 0) {
    throw new EnvironmentError(
      `the tokenizer in ${tokenizer.dir}${bundled ? ' (the bundled one: no tokenizer.path is set)' : ' (tokenizer.path)'} is not the one ${endpoint} ` +
        `serves${modelPath === undefined ? '' : ` for "${modelPath}"`}: a probe text tokenizes differently from token ${at} on ` +
        `(here ${String(local[at] ?? 'end')}, server ${String(probeIds[at] ?? 'end')}). Set tokenizer.path to the served model's tokenizer folder`,
    );
  }
}

/** The conversation server-side tokenization is probed with: system, user, assistant, user. */
export const SERVER_PROBE_CONVERSATION: readonly ChatMessage[] = [
  { role: 'system', content: 'tokenmill probe: system message.' },
  { role: 'user', content: 'tokenmill probe: Hello, world! 12345 你好，世界 🙂' },
  { role: 'assistant', content: 'tokenmill probe answer: def f(x): return x**2' },
  { role: 'user', content: 'tokenmill probe: and once more?' },
];

/**
 * Checks the local chat template against `endpoint` for server-side tokenization (see the
 * module comment). Throws an {@link EnvironmentError} naming the endpoint and the first
 * differing position or the token that does not come back as its id.
 */
export async function checkServerTokenizer(
  tokenizer: ChatTokenizer,
  client: ServerTokenizeClient,
  endpoint: string,
): Promise<void> {
  const rendered = tokenizer.applyChatTemplate(SERVER_PROBE_CONVERSATION, { addGenerationPrompt: true });
  const [local] = await client.tokenize([rendered], endpoint);
  const special = new Set<number>(tokenizer.endOfTurnTokenIds);
  for (const id of tokenizer.specialTokenIds) {
    const text = tokenizer.idToToken(id);
    if (text !== undefined && text !== '' && rendered.includes(text)) special.add(id);
  }
  const ids = [...special].sort((a, b) => a - b);
  const texts = ids.map((id) => tokenizer.idToToken(id) ?? '');
  const single = await client.tokenize(texts, endpoint);
  ids.forEach((id, i) => {
    const got = single[i] ?? [];
    if (got.length !== 1 || got[0] !== id) {
      throw new EnvironmentError(
        `${endpoint}/tokenize gives the special token ${JSON.stringify(texts[i])} as ${JSON.stringify(got)}, not its id ${id} in ` +
          `${tokenizer.dir}/tokenizer_config.json: the tokenizer folder (tokenizer.path) is not the served model's`,
      );
    }
  });
  const served = await client.tokenizeMessages(endpoint, SERVER_PROBE_CONVERSATION);
  if (served === undefined) {
    logger('tokenizer-check').warn(
      { endpoint, tokenizer: tokenizer.dir },
      `${endpoint}/tokenize does not take {messages}: the chat template in ${tokenizer.dir} could not be compared with the server's own (special tokens were checked)`,
    );
    return;
  }
  const at = firstDifference(local ?? [], served);
  if (at >= 0) {
    throw new EnvironmentError(
      `the chat template in ${tokenizer.dir} (tokenizer.path) renders a probe conversation differently from ${endpoint}'s own: ` +
        `${endpoint}/tokenize of the local rendering and of {messages} differ from token ${at} on ` +
        `(local ${String(local?.[at] ?? 'end')}, server ${String(served[at] ?? 'end')}). Set tokenizer.path to the served model's tokenizer folder`,
    );
  }
}

/**
 * Loads the tokenizer as `config.tokenizer` says and checks it against every endpoint that
 * answers (with server-side tokenization: every endpoint); throws an {@link EnvironmentError}
 * on a mismatch, before anything is produced.
 */
export async function loadRunTokenizer(config: Config): Promise<ChatTokenizer> {
  checkTokenizerKindFits(config);
  const tokenizer = await loadConfiguredTokenizer(config);
  const bundled = path.resolve(config.tokenizer.path) === path.resolve(bundledTokenizerPath());
  const facts = await Promise.all(config.sglang.endpoints.map((endpoint) => endpointFacts(config, endpoint)));
  const client = tokenizer.serverClient;
  for (const f of facts) {
    if (client === undefined) checkTokenizerAgainst(tokenizer, bundled, f);
    else checkTokenizerAgainst(tokenizer, bundled, { ...f, probeIds: undefined });
  }
  if (client !== undefined)
    for (const endpoint of client.endpoints) await checkServerTokenizer(tokenizer, client, endpoint);
  return tokenizer;
}
