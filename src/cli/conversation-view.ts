/**
 * `tokenmill show`: one conversation (or prompt) of a run, put back together for a person to
 * read. Its source messages come from the dataset's prompt file (found by the dataset's id
 * scheme), each turn's answer and how it was made from the generation records (the files under
 * `<run>/<dataset>/generations`, then the results Redis holds that the sink has not written
 * yet), and how the conversation ended from Redis (finish-conversation-4.lua), when Redis can be
 * reached.
 */
import { createReadStream } from 'node:fs';
import { access, readdir } from 'node:fs/promises';
import path from 'node:path';
import { createInterface } from 'node:readline';
import type { Redis } from 'ioredis';

import {
  AppError,
  conversationTurns,
  detectToolCallFormat,
  errorMessage,
  isRecord,
  parseToolCalls,
  answerTextWithSpecials,
  type ChatMessage,
  type ChatTokenizer,
  type Config,
  type PromptRecord,
  type RunKeys,
  type ToolCallFormat,
  countLines,
} from '../shared/index.js';
import { partitionOf, partitionsFor, PromptIndex, promptIdOf, type SampleIdScheme } from './export/index.js';

/** The results a turn's calls were answered with, placed after it in the next turn's history. */
export interface PlacedToolResults {
  /** `source`: the source's own results, spliced in; `executor`: run by the dataset's tool executor. */
  origin: 'source' | 'executor';
  messages: ChatMessage[];
}

/** One turn (or a single-turn prompt's one answer) as `show` prints it. */
export interface TurnView {
  turn: number;
  /** The sample id of the turn's record: `<conversation>#t<k>` (a single-turn prompt: its sample id). */
  id: string;
  /** The source messages that lead to this turn (since the turn before it): system, user and tool messages. */
  source: ChatMessage[];
  /** The source's own answer at this turn, never sent to the model; null for an open end. */
  sourceAnswer: ChatMessage | null;
  /** Whether a record of this turn exists. */
  generated: boolean;
  /** Why it was not generated, when it was not. */
  notGenerated?: string;
  /** How its prompt was built: from the previous turn's ids (`spliced`) or rendered from text (`rendered`). */
  prompt?: 'spliced' | 'rendered';
  /** The record's finish reason, in one word and as SGLang gave it. */
  finish?: { type: string; text: string; raw: unknown };
  promptTokens?: number;
  outputTokens?: number;
  /** The regenerated answer: the output ids decoded with the run's tokenizer (special tokens kept). */
  text?: string;
  /**
   * The turn's tool calls: the record's own when it carries them, else read from its output in
   * the model's call format (a conversation with tools only); absent without a call.
   */
  toolCalls?: unknown[];
  /** Why the turn's output does not read as calls (an opened call that does not parse). */
  toolCallError?: string;
  /** The results placed after this turn's calls in the next turn's history (that record's `tool_results`). */
  toolResults?: PlacedToolResults;
  ts?: string;
  endpoint?: string;
}

/** How a conversation (or prompt) ended, as far as can be told. */
export interface EndView {
  /**
   * `complete`: every turn committed; `ended`: ended early (see `reason`); `in-progress`: started,
   * not finished (or cut short by the budget or a stop: it resumes at its next turn); `failed`: a
   * single-turn prompt whose attempts were spent; `not-generated`: nothing of it yet; `unknown`:
   * Redis could not be reached.
   */
  state: 'complete' | 'ended' | 'in-progress' | 'failed' | 'not-generated' | 'unknown';
  /** The turn it ended at (ended only). */
  turn?: number;
  /** Why it ended early (`context: …`, `failed: …`, `error: …`, `history-lost`, `tool-…`), or why it failed. */
  reason?: string;
  /** The first word of `reason`: the cause `status` counts. */
  cause?: string;
  /** Turns committed, by Redis's end record (else by the records found). */
  turnsDone?: number;
  /** One line for a person. */
  text: string;
}

/** One conversation (or single-turn prompt, or one sample of either) put back together. */
export interface ConversationView {
  dataset: string;
  /** `conversation` (`turns: all`) or `prompt` (one answer per prompt). */
  kind: 'conversation' | 'prompt';
  /** The sample id: the conversation's id (`<id>` or `<id>#s<j>`), or a prompt's sample id. */
  id: string;
  /** The prompt file's id of it. */
  promptId: string;
  promptFile: string;
  /** Whether the prompt file still has its line; `sourceError` says why it could not be read. */
  promptFound: boolean;
  sourceError?: string;
  /** Names of the tools its prompt offers (the record's `tools`), empty without tools. */
  tools: string[];
  /**
   * With tools: the format the turns' calls were read in (`tokenizer.toolCallFormat`, else read
   * from the chat template); null when the template renders no call, so none was read.
   */
  toolCallFormat?: ToolCallFormat | null;
  /** Turns of the conversation (1 for a prompt); null when neither the source nor a record says. */
  turnCount: number | null;
  end: EndView;
  turns: TurnView[];
}

/** What {@link readConversationViews} reads. */
export interface ShowSource {
  config: Config;
  dataset: string;
  /** An id as a person gives it: a prompt's, a sample's (`#s<j>`) or a turn's (`#t<k>`). */
  id: string;
  /** The run's tokenizer, loaded when an answer is to be decoded. */
  tokenizer: () => Promise<ChatTokenizer>;
  /** The run's Redis and keys; undefined when it could not be reached. */
  redis?: { conn: Redis; keys: RunKeys } | undefined;
  runDir: string;
}

type DatasetConfig = Config['datasets'][number];

/** A generation record's fields `show` reads (the rest are ignored). */
interface RecordFields {
  id: string;
  turn?: number;
  turns?: number;
  spliced?: boolean;
  prompt_ids?: unknown;
  output_ids?: unknown;
  finish_reason?: unknown;
  ts?: unknown;
  endpoint?: unknown;
  tool_calls?: unknown;
  tool_results?: unknown;
  tools?: unknown;
}

/**
 * The views of `id` in its dataset: one, or one per sample for a prompt id of a dataset with
 * `samplesPerPrompt` > 1. Throws an {@link AppError} naming the dataset, the id and where it was
 * looked for when the dataset has no such prompt and no record of it.
 */
export async function readConversationViews(src: ShowSource): Promise<ConversationView[]> {
  const ds = showableDataset(src.config, src.dataset);
  const scheme: SampleIdScheme = { samplesPerPrompt: ds.samplesPerPrompt, turns: ds.turns };
  const kind = ds.turns === 'all' ? 'conversation' : 'prompt';
  // A turn's id names its conversation: `<c>#t<k>` → `<c>`.
  const sampleId = kind === 'conversation' ? stripTurn(src.id) : src.id;
  const promptId = promptIdOf(sampleId, scheme, { conversation: true });
  const sampleIds =
    promptId === sampleId && ds.samplesPerPrompt > 1
      ? Array.from({ length: ds.samplesPerPrompt }, (_, j) => `${promptId}#s${j + 1}`)
      : [sampleId];

  const prompt = await readPrompt(ds, promptId);
  const generationsDir = path.join(src.runDir, ds.name, 'generations');
  const records = await readRecords(src, ds.name, kind, sampleIds, generationsDir);
  if (prompt.record === undefined && [...records.values()].every((r) => r.length === 0)) {
    const samples = ds.samplesPerPrompt > 1 ? ` (samples ${promptId}#s1 … #s${ds.samplesPerPrompt})` : '';
    throw new AppError(
      `no ${kind} "${src.id}" in dataset "${ds.name}": ${prompt.error ?? `no line with id "${promptId}" in its prompt file ${ds.prompts}`}, and no generation record of it${samples} under ${generationsDir}${src.redis === undefined ? '' : ' or in Redis'}`,
    );
  }
  const views: ConversationView[] = [];
  for (const id of sampleIds) {
    const view =
      kind === 'conversation'
        ? await conversationView(src, ds, id, promptId, prompt, records.get(id) ?? [])
        : await promptView(src, ds, id, promptId, prompt, records.get(id) ?? []);
    views.push(view);
  }
  return views;
}

/** The dataset `name` of the config, if it is one whose prompts are generated; else an {@link AppError} saying why not. */
export function showableDataset(config: Config, name: string): DatasetConfig & { prompts: string } {
  const ds = config.datasets.find((d) => d.name === name);
  if (ds === undefined)
    throw new AppError(
      `no dataset "${name}" in the config of run "${config.run}" (datasets: ${config.datasets.map((d) => d.name).join(', ')})`,
    );
  if (ds.prompts === undefined)
    throw new AppError(
      `dataset "${ds.name}" is a conversation dataset (${ds.conversations ?? ''} is already conversations): nothing is generated for it to show`,
    );
  return ds as DatasetConfig & { prompts: string };
}

function stripTurn(id: string): string {
  const m = /#t([1-9]\d*)$/.exec(id);
  return m === null ? id : id.slice(0, m.index);
}

interface PromptLookup {
  record: PromptRecord | undefined;
  error?: string;
}

/** The prompt line of `promptId` in the dataset's prompt file, by the file's own index. */
async function readPrompt(ds: DatasetConfig, promptId: string): Promise<PromptLookup> {
  const file = ds.prompts as string;
  try {
    await access(file);
  } catch {
    return { record: undefined, error: `its prompt file ${file} does not exist` };
  }
  const partitions = partitionsFor(await countLines(file));
  const index = await PromptIndex.build(file, partitionOf(promptId, partitions), partitions, { turns: ds.turns });
  try {
    const got = await index.get(promptId);
    if (got === undefined) return { record: undefined };
    if ('error' in got) return { record: undefined, error: `its line no longer parses (${got.error})` };
    return { record: got };
  } finally {
    await index.close();
  }
}

/**
 * The records of the given samples (a conversation's turns by `conversation_id`, a prompt's
 * answer by `id`): the generation files in name order, then the results still in Redis. A
 * record id seen twice is taken once (the first).
 */
async function readRecords(
  src: ShowSource,
  dataset: string,
  kind: 'conversation' | 'prompt',
  sampleIds: readonly string[],
  dir: string,
): Promise<Map<string, RecordFields[]>> {
  const wanted = new Set(sampleIds);
  const out = new Map<string, RecordFields[]>(sampleIds.map((id) => [id, []]));
  const seen = new Set<string>();
  const needles = sampleIds.map((id) => JSON.stringify(id));
  const take = (line: string): void => {
    // Most lines are other samples': parsed only when they may name a wanted one.
    if (!needles.some((n) => line.includes(n))) return;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch {
      return; // a torn last line of a file being written: the sink writes it again
    }
    if (!isRecord(v) || typeof v.id !== 'string' || seen.has(v.id)) return;
    const owner = kind === 'conversation' ? v.conversation_id : v.id;
    if (typeof owner !== 'string' || !wanted.has(owner)) return;
    seen.add(v.id);
    out.get(owner)?.push(v as unknown as RecordFields);
  };
  for (const file of await generationFiles(dir)) {
    const lines = createInterface({ input: createReadStream(file), crlfDelay: Infinity });
    for await (const line of lines) take(line);
  }
  if (src.redis !== undefined) {
    const { conn, keys } = src.redis;
    let from = '-';
    for (;;) {
      const page = await conn.xrange(keys.results(dataset), from, '+', 'COUNT', 1000);
      for (const [, fields] of page) {
        const i = fields.indexOf('r');
        if (i >= 0 && fields[i + 1] !== undefined) take(fields[i + 1] as string);
      }
      if (page.length < 1000) break;
      from = `(${(page[page.length - 1] as [string, string[]])[0]}`;
    }
  }
  for (const list of out.values()) list.sort((a, b) => (a.turn ?? 0) - (b.turn ?? 0));
  return out;
}

async function generationFiles(dir: string): Promise<string[]> {
  const names = await readdir(dir).catch(() => [] as string[]);
  return names
    .filter((n) => n.endsWith('.jsonl') && !n.startsWith('.'))
    .sort()
    .map((n) => path.join(dir, n));
}

/** The source messages that lead to each turn, and the source's answer at it. */
function sourceTurns(
  messages: readonly ChatMessage[],
): { source: ChatMessage[]; answer: ChatMessage | null }[] | string {
  const shape = conversationTurns(messages);
  if (typeof shape === 'string') return shape;
  return shape.starts.map((start, k) => {
    const from = k === 0 ? 0 : (shape.starts[k - 1] as number) + 1;
    // Assistant messages right after an earlier turn's answer continue it in the source: never sent.
    const source = messages.slice(from, start).filter((m) => m.role !== 'assistant');
    return { source, answer: messages[start] ?? null };
  });
}

function toolNames(record: PromptRecord | undefined): string[] {
  return (record?.tools ?? []).flatMap((t) => {
    if (!isRecord(t)) return [];
    const fn = isRecord(t.function) ? t.function : t;
    return typeof fn.name === 'string' ? [fn.name] : [];
  });
}

async function conversationView(
  src: ShowSource,
  ds: DatasetConfig,
  id: string,
  promptId: string,
  prompt: PromptLookup,
  records: RecordFields[],
): Promise<ConversationView> {
  const sources = prompt.record === undefined ? undefined : sourceTurns(prompt.record.messages);
  const sourceError =
    prompt.error ??
    (prompt.record === undefined
      ? `no line with id "${promptId}" in ${ds.prompts ?? ''}`
      : typeof sources === 'string'
        ? sources
        : undefined);
  const byTurn = new Map<number, RecordFields>();
  for (const r of records) if (typeof r.turn === 'number' && !byTurn.has(r.turn)) byTurn.set(r.turn, r);
  const turnCount =
    (Array.isArray(sources) ? sources.length : undefined) ??
    records.find((r) => typeof r.turns === 'number')?.turns ??
    null;
  const end = await conversationEnd(src, ds.name, id, byTurn.size, turnCount);
  const tools = toolNames(prompt.record);
  const withTools = tools.length > 0 || records.some((r) => Array.isArray(r.tools) && r.tools.length > 0);
  let format: ToolCallFormat | null | undefined;
  const last = Math.max(turnCount ?? 0, ...byTurn.keys());
  const turns: TurnView[] = [];
  for (let k = 1; k <= last; k += 1) {
    const s = Array.isArray(sources) ? sources[k - 1] : undefined;
    const view: TurnView = {
      turn: k,
      id: `${id}#t${k}`,
      source: s?.source ?? [],
      sourceAnswer: s?.answer ?? null,
      generated: false,
    };
    const r = byTurn.get(k);
    if (r !== undefined) {
      await fillFromRecord(view, r, src.tokenizer);
      view.prompt = r.spliced === true ? 'spliced' : 'rendered';
      if (withTools && view.toolCalls === undefined) {
        const tok = await src.tokenizer();
        format ??= callFormatOf(src.config, tok);
        if (format !== null) readCalls(view, tok, format, r.output_ids);
      }
    } else {
      view.notGenerated =
        end.state === 'ended' && end.turn !== undefined && k >= end.turn
          ? k === end.turn
            ? `the conversation ended here: ${end.reason ?? '?'}`
            : `the conversation ended at turn ${end.turn}`
          : end.state === 'unknown'
            ? 'no record of it'
            : 'not generated yet';
    }
    const placed = placedResults(byTurn.get(k + 1)?.tool_results);
    if (placed !== undefined) view.toolResults = placed;
    turns.push(view);
  }
  return {
    dataset: ds.name,
    kind: 'conversation',
    id,
    promptId,
    promptFile: ds.prompts ?? '',
    promptFound: prompt.record !== undefined,
    ...(sourceError === undefined ? {} : { sourceError }),
    tools,
    ...(withTools ? { toolCallFormat: format ?? callFormatOf(src.config, await src.tokenizer()) } : {}),
    turnCount,
    end,
    turns,
  };
}

async function promptView(
  src: ShowSource,
  ds: DatasetConfig,
  id: string,
  promptId: string,
  prompt: PromptLookup,
  records: RecordFields[],
): Promise<ConversationView> {
  const view: TurnView = {
    turn: 1,
    id,
    source: prompt.record?.messages ?? [],
    sourceAnswer: null,
    generated: false,
  };
  const r = records[0];
  let end: EndView;
  if (r !== undefined) {
    await fillFromRecord(view, r, src.tokenizer);
    end = { state: 'complete', turnsDone: 1, text: 'answered' };
  } else {
    end = await promptEnd(src, ds.name, id);
    view.notGenerated = end.text;
  }
  return {
    dataset: ds.name,
    kind: 'prompt',
    id,
    promptId,
    promptFile: ds.prompts ?? '',
    promptFound: prompt.record !== undefined,
    ...(prompt.record === undefined
      ? { sourceError: prompt.error ?? `no line with id "${promptId}" in ${ds.prompts ?? ''}` }
      : {}),
    tools: toolNames(prompt.record),
    turnCount: 1,
    end,
    turns: [view],
  };
}

async function fillFromRecord(view: TurnView, r: RecordFields, load: () => Promise<ChatTokenizer>): Promise<void> {
  view.generated = true;
  const promptIds = Array.isArray(r.prompt_ids) ? (r.prompt_ids as number[]) : [];
  const outputIds = Array.isArray(r.output_ids) ? (r.output_ids as number[]) : [];
  view.promptTokens = promptIds.length;
  view.outputTokens = outputIds.length;
  const tokenizer = await load();
  try {
    view.text = await tokenizer.withServerTokens(() => tokenizer.decode(outputIds));
  } catch (e: unknown) {
    view.text = `(the output ids do not decode with the run's tokenizer: ${errorMessage(e)})`;
  }
  const finish = finishOf(r.finish_reason);
  if (finish !== undefined) view.finish = finish;
  if (Array.isArray(r.tool_calls)) view.toolCalls = r.tool_calls;
  if (typeof r.ts === 'string') view.ts = r.ts;
  if (typeof r.endpoint === 'string') view.endpoint = r.endpoint;
}

/** How the model writes its calls: `tokenizer.toolCallFormat` when the config names one, else read from the chat template. */
function callFormatOf(config: Config, tok: ChatTokenizer): ToolCallFormat | null {
  const configured = config.tokenizer.toolCallFormat;
  if (configured !== 'auto') return configured;
  return detectToolCallFormat(tok.chatTemplateSource()) ?? null;
}

/** Reads a generated turn's calls as the conversation's driver reads them (`answerTextWithSpecials`). */
function readCalls(view: TurnView, tok: ChatTokenizer, format: ToolCallFormat, output: unknown): void {
  const ids = Array.isArray(output) ? (output as number[]) : [];
  let text: string;
  try {
    text = answerTextWithSpecials(tok, ids);
  } catch {
    return; // shown as undecodable already
  }
  const parsed = parseToolCalls(format, text, { turn: view.turn });
  if (!parsed.ok) view.toolCallError = parsed.reason;
  else if (parsed.calls.length > 0) view.toolCalls = parsed.calls;
}

/** `stop (token 151645)`, `stop ("###")`, `length (64)`, `abort (…)`. */
function finishOf(raw: unknown): TurnView['finish'] {
  if (typeof raw === 'string') return { type: raw, text: raw, raw };
  if (!isRecord(raw) || typeof raw.type !== 'string') return { type: '?', text: JSON.stringify(raw) ?? '?', raw };
  const type = raw.type;
  let detail = '';
  if (type === 'stop') {
    const m = raw.matched;
    detail =
      typeof m === 'number'
        ? `token ${m}`
        : typeof m === 'string'
          ? `stop string ${JSON.stringify(m)}`
          : Array.isArray(m)
            ? `tokens ${m.join(' ')}`
            : '';
  } else if (type === 'length' && typeof raw.length === 'number') {
    detail = `at ${raw.length} tokens`;
  } else if (type === 'abort' && raw.message !== undefined) {
    detail = typeof raw.message === 'string' ? raw.message : JSON.stringify(raw.message);
  }
  return { type, text: detail === '' ? type : `${type} (${detail})`, raw };
}

function placedResults(raw: unknown): PlacedToolResults | undefined {
  if (!isRecord(raw) || !Array.isArray(raw.messages)) return undefined;
  const origin = raw.origin === 'executor' ? 'executor' : 'source';
  const messages = raw.messages.flatMap((m): ChatMessage[] => {
    if (!isRecord(m)) return [];
    const msg: ChatMessage = {
      role: 'tool',
      content: typeof m.content === 'string' ? m.content : JSON.stringify(m.content),
    };
    if (typeof m.tool_call_id === 'string') msg.tool_call_id = m.tool_call_id;
    if (typeof m.name === 'string') msg.name = m.name;
    return [msg];
  });
  return { origin, messages };
}

const NO_REDIS = 'unknown (Redis not reachable)';

async function conversationEnd(
  src: ShowSource,
  dataset: string,
  id: string,
  committed: number,
  turnCount: number | null,
): Promise<EndView> {
  const onDisk = `${committed}${turnCount === null ? '' : ` of ${turnCount}`} turns found`;
  if (src.redis === undefined) return { state: 'unknown', turnsDone: committed, text: `${NO_REDIS}; ${onDisk}` };
  const { conn, keys } = src.redis;
  const raw = await conn.hget(keys.conversations(dataset), id);
  if (raw === null) {
    if (committed === 0) return { state: 'not-generated', turnsDone: 0, text: 'not started' };
    return {
      state: 'in-progress',
      turnsDone: committed,
      text: `not finished: ${onDisk} (in progress, or cut short by the budget or a stop: it resumes at its next turn)`,
    };
  }
  let end: Record<string, unknown> = {};
  try {
    const v: unknown = JSON.parse(raw);
    if (isRecord(v)) end = v;
  } catch {
    // an unreadable end record is shown as it is
  }
  const turnsDone = typeof end.turnsDone === 'number' ? end.turnsDone : committed;
  const turns = typeof end.turns === 'number' ? end.turns : turnCount;
  const of = `${turnsDone}${turns === null ? '' : ` of ${turns}`} turns committed`;
  if (end.kind === 'complete') return { state: 'complete', turnsDone, text: `complete: ${of}` };
  const reason = typeof end.reason === 'string' ? end.reason : raw;
  const cause = /^([a-z-]+)/.exec(reason)?.[1] ?? 'other';
  const view: EndView = { state: 'ended', reason, cause, turnsDone, text: '' };
  if (typeof end.turn === 'number') view.turn = end.turn;
  view.text = `ended early${view.turn === undefined ? '' : ` at turn ${view.turn}`}: ${reason}; ${of}`;
  return view;
}

async function promptEnd(src: ShowSource, dataset: string, id: string): Promise<EndView> {
  if (src.redis === undefined) return { state: 'unknown', text: `no record of it; ${NO_REDIS}` };
  const { conn, keys } = src.redis;
  const [failed, skipped] = await Promise.all([
    conn.hget(keys.failed(dataset), id),
    conn.sismember(keys.skipped(dataset), id),
  ]);
  if (failed !== null) {
    let reason = failed;
    try {
      const v: unknown = JSON.parse(failed);
      if (isRecord(v) && typeof v.reason === 'string') reason = v.reason;
    } catch {
      // shown as stored
    }
    return { state: 'failed', reason, text: `failed: ${reason}` };
  }
  if (skipped === 1) return { state: 'not-generated', text: 'skipped by the budget' };
  return { state: 'not-generated', text: 'not generated yet' };
}
