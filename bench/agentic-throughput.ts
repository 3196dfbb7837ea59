// Benchmark: agentic multi-turn generation (`turns: all`, records with OpenAI tools, the model
// calling them). (1) Throughput: output tokens/s the simulator decodes in a window of steady
// state (steady-window.ts) for agentic conversations — after each turn the worker reads the
// model's calls, matches them to the source's results and builds the next prompt with the tools
// — against single-turn generation of the same turns' prompts (each turn's source history, with
// the tools, as one prompt: as many requests, answered the same way, with the same completion
// lengths and prompts as long), on one endpoint with the same slots. (2) Parse cost per turn: the
// CPU time, in this process, of what the worker does between two turns of an agentic
// conversation (decode the answer, with and without its special tokens; parse the calls; match
// the source's results; render and encode the next prompt with the tools), over the turns the run
// generated, against the same work for a plain text turn (decode; render the next prompt
// without tools), and as a share of the run's mean turn latency.
import path from 'node:path';
import { startSimulator } from '../src/sim/index.js';
import {
  answerMessage,
  answerTextWithSpecials,
  bundledTokenizerPath,
  conversationTurns,
  loadTokenizer,
  matchSourceResults,
  parseChatMessage,
  parseToolCalls,
  renderTurnPrompt,
  sourceCalls,
  sourceTurnStep,
  turnHistory,
  undefinedToolCall,
  type ChatMessage,
  type ChatTokenizer,
  type ConversationTurns,
  type RegeneratedAnswer,
} from '../src/shared/index.js';
import { readToolTurn } from '../src/workers/inference/conversation-tools.js';
import { agenticRecords, writeAgentic, type AgenticRecord } from '../test/helpers/agentic.js';
import { readGenerations } from '../test/helpers/pipeline.js';
import {
  benchConfig,
  fmtInt,
  isMain,
  longPrompt,
  openBenchEnv,
  round,
  runAsScript,
  startTokenmill,
  writePrompts,
  type BenchEnv,
  type BenchResult,
} from './lib.js';
import { steadyWindow, type WindowMeasure } from './steady-window.js';

export interface AgenticThroughputOptions {
  /** Agentic conversations (each 3–8 turns: 2–7 rounds of calls, then a text answer). */
  conversations: number;
  slots: number;
  /** The final (text) answer's length, uniform; a turn with calls is as long as its calls. */
  outputMin: number;
  outputMax: number;
  /** The simulator's rate of parallel rounds (2–3 calls at once); the records' plans use the same. */
  parallel: number;
  timeScale: number;
  /** Simulated seconds from the first request to the window's start, and of the window. */
  warmupSimS: number;
  windowSimS: number;
  /** Rounds of the in-process parse-cost measure over the run's turns (the median is reported). */
  parseRounds: number;
  /** The parse-cost measure takes the run's conversations until it has this many turns. */
  parseTurns: number;
  /** Required agentic / single-turn output tokens/s. */
  targetThroughputRatio: number;
}

// A conversation is ~5.5 turns: ~4.5 turns of calls (~40 tokens each) and one answer of ~500
// tokens, ~26 simulated s of a slot; 64 slots go through ~2.4 conversations a simulated second,
// so ~460 of the 800 have started by the window's end. At timeScale 5 a turn with calls takes
// ~0.3 s of wall time (1.5 s simulated), ~65 turns a wall second on 64 slots.
export const DEFAULT_AGENTIC_THROUGHPUT: AgenticThroughputOptions = {
  conversations: 800,
  slots: 64,
  outputMin: 200,
  outputMax: 800,
  parallel: 0.2,
  timeScale: 5,
  warmupSimS: 40,
  windowSimS: 150,
  parseRounds: 3,
  parseTurns: 2000,
  targetThroughputRatio: 0.97,
};

type Kind = 'agentic' | 'single-turn';

interface ThroughputRun extends Omit<WindowMeasure, 'received'> {
  kind: Kind;
  /** Requests received up to the window's end. */
  requestsReceived: number;
  /** Mean end-to-end latency of a request answered in the window, simulated seconds (what it is at the simulator's speed). */
  meanLatencySimS: number;
  /** Tokens decoded in the window per request answered in it. */
  meanOutputTokens: number;
}

/** The turns of a record, parsed as the worker parses them. */
function parsed(rec: AgenticRecord): { messages: ChatMessage[]; turns: ConversationTurns } {
  const messages = rec.messages.map((m, i) => parseChatMessage(m, `messages[${i}]`));
  const turns = conversationTurns(messages);
  if (typeof turns === 'string') throw new Error(`${rec.id}: ${turns}`);
  return { messages, turns };
}

async function runThroughput(
  env: BenchEnv,
  o: AgenticThroughputOptions,
  kind: Kind,
  singleCount: number,
): Promise<ThroughputRun> {
  const sim = await startSimulator({
    timeScale: o.timeScale,
    maxRunningRequests: o.slots,
    seed: 11,
    outputLength: {
      distribution: 'uniform',
      mean: (o.outputMin + o.outputMax) / 2,
      min: o.outputMin,
      max: o.outputMax,
    },
    // Every round of the plan called as planned: each conversation runs whole, its turns the
    // single-turn case's prompts.
    toolCalls: { probability: 1, parallel: o.parallel, divergent: 0, malformed: 0 },
  });
  try {
    const config = benchConfig(env, {
      run: kind,
      endpoint: sim.url,
      concurrency: o.slots,
      datasets: [
        kind === 'agentic'
          ? {
              name: 'ag',
              prompts: 'ag.jsonl',
              turns: 'all',
              tokenBudget: 1_000_000_000,
              maxNewTokens: o.outputMax,
              batchSize: 8,
            }
          : { name: 'ag', prompts: 'ag-single.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: o.outputMax },
      ],
    });
    const gen = await startTokenmill(config);
    try {
      const w = await steadyWindow(sim, { ...o, redisPid: env.redis.server.pid }, kind, (received) => {
        const firsts = kind === 'agentic' ? received.filter((r) => /#t1#/.test(r.rid)).length : received.length;
        return firsts < (kind === 'agentic' ? o.conversations : singleCount);
      });
      const { received, ...rest } = w;
      return {
        kind,
        ...rest,
        requestsReceived: received.length,
        meanOutputTokens: round(w.windowTokens / Math.max(1, w.requestsFinished), 1),
        meanLatencySimS: round(w.meanLatencyWallS * o.timeScale, 3),
      };
    } finally {
      await gen.stop();
    }
  } finally {
    await sim.stop();
  }
}

/** A generated turn, as its record has it. */
interface GeneratedTurn {
  conversation_id: string;
  turn: number;
  prompt_ids: number[];
  output_ids: number[];
}

/** A conversation's generated turns 1..n, with its source record parsed, and its plain-text twin. */
interface Chain {
  messages: ChatMessage[];
  turns: ConversationTurns;
  tools: unknown[];
  /** The same conversation as plain text: the calls' results as user messages, no tools. */
  plain: { messages: ChatMessage[]; turns: ConversationTurns; firstIds: number[] };
  generated: GeneratedTurn[];
}

/** The source as a text conversation: system, user, then per step the answer and its results as one user message. */
function plainTwin(tok: ChatTokenizer, messages: readonly ChatMessage[], turns: ConversationTurns): Chain['plain'] {
  const out: ChatMessage[] = messages.slice(0, turns.starts[0]).map((m) => ({ ...m }));
  for (let k = 1; k <= turns.starts.length; k += 1) {
    const step = sourceTurnStep(messages, turns, k);
    out.push({ role: 'assistant', content: 'source answer' });
    if (step.results.length > 0) out.push({ role: 'user', content: step.results.map((m) => m.content).join('\n') });
  }
  const t = conversationTurns(out);
  if (typeof t === 'string') throw new Error(t);
  return { messages: out, turns: t, firstIds: tok.encodePrompt(turnHistory(out, t, 1, [])) };
}

interface ParseCost {
  /** Turns followed by another (the work measured: read the turn, build the next prompt). */
  turns: number;
  /** Of those, turns whose answer made calls (and got the source's results). */
  turnsWithCalls: number;
  agenticUsPerTurn: number;
  /** The same, timed part by part (sum of the parts; in the same round). */
  parts: { decodeUs: number; parseUs: number; matchUs: number; renderUs: number };
  plainUsPerTurn: number;
  ratio: number;
  /** Of the rounds: the agentic and plain µs per turn of each. */
  rounds: { agentic: number; plain: number }[];
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/**
 * The driver's work after turn k of an agentic conversation (conversation-driver.ts): decode the
 * answer, read its calls and find the results (readToolTurn), then turn k + 1's history and
 * prompt (renderTurnPrompt with the tools, spliced where the template continues). Returns the
 * turns measured and how many had calls.
 */
async function agenticChain(tok: ChatTokenizer, c: Chain): Promise<{ turns: number; withCalls: number }> {
  const answers: RegeneratedAnswer[] = [];
  const results: (ChatMessage[] | undefined)[] = [];
  const first = c.generated[0] as GeneratedTurn;
  let previous: { promptIds: readonly number[]; history: ChatMessage[]; text?: string } = {
    promptIds: first.prompt_ids,
    history: turnHistory(c.messages, c.turns, 1, []),
  };
  let withCalls = 0;
  const total = c.turns.starts.length;
  for (let k = 1; k < c.generated.length; k += 1) {
    const ids = (c.generated[k - 1] as GeneratedTurn).output_ids;
    answerMessage(tok, ids);
    const read = await readToolTurn(
      tok,
      { dataset: 'ag', conversationId: 'c', turn: k, total, outputIds: ids, messages: c.messages, turns: c.turns },
      { format: 'hermes', tools: c.tools },
    );
    if (read.kind === 'end') throw new Error(`turn ${k} of a generated conversation ends it: ${read.reason}`);
    if (read.results !== undefined) {
      results[k - 1] = read.results;
      withCalls += 1;
    }
    answers.push({ outputIds: ids, message: read.message });
    const hist = turnHistory(
      c.messages,
      c.turns,
      k + 1,
      answers.map((a) => a.message),
      results,
    );
    const prompt = renderTurnPrompt(tok, {
      history: hist,
      previous: { ...previous, answer: answers[k - 1] as RegeneratedAnswer },
      tools: c.tools,
    });
    previous = { promptIds: prompt.ids, history: hist, text: prompt.text };
  }
  return { turns: c.generated.length - 1, withCalls };
}

/** The same work, timed part by part with the pieces readToolTurn is made of (no executor). */
function agenticParts(tok: ChatTokenizer, c: Chain, parts: ParseCost['parts']): void {
  const answers: ChatMessage[] = [];
  const results: (ChatMessage[] | undefined)[] = [];
  const first = c.generated[0] as GeneratedTurn;
  let previous: { promptIds: readonly number[]; history: ChatMessage[]; text?: string } = {
    promptIds: first.prompt_ids,
    history: turnHistory(c.messages, c.turns, 1, []),
  };
  for (let k = 1; k < c.generated.length; k += 1) {
    const ids = (c.generated[k - 1] as GeneratedTurn).output_ids;
    let t = performance.now();
    const plain = answerMessage(tok, ids);
    const text = answerTextWithSpecials(tok, ids);
    let u = performance.now();
    parts.decodeUs += (u - t) * 1000;
    t = u;
    const p = parseToolCalls('hermes', text, { turn: k });
    if (!p.ok) throw new Error(`turn ${k}: ${p.reason}`);
    const message: ChatMessage =
      p.calls.length === 0 ? plain : { role: 'assistant', content: p.content, tool_calls: p.calls };
    u = performance.now();
    parts.parseUs += (u - t) * 1000;
    t = u;
    if (undefinedToolCall(p.calls, c.tools, k) !== undefined) throw new Error(`turn ${k}: an unknown tool`);
    const step = sourceTurnStep(c.messages, c.turns, k);
    if (step.assistant !== undefined) sourceCalls(step.assistant);
    if (p.calls.length > 0) {
      const m = matchSourceResults(k, p.calls, {
        assistant: step.assistant ?? { role: 'assistant', content: '' },
        results: step.results,
      });
      if (!m.ok) throw new Error(m.reason);
      results[k - 1] = m.results;
    }
    u = performance.now();
    parts.matchUs += (u - t) * 1000;
    t = u;
    answers.push(message);
    const hist = turnHistory(c.messages, c.turns, k + 1, answers, results);
    const prompt = renderTurnPrompt(tok, {
      history: hist,
      previous: { ...previous, answer: { outputIds: ids, message } },
      tools: c.tools,
    });
    previous = { promptIds: prompt.ids, history: hist, text: prompt.text };
    parts.renderUs += (performance.now() - t) * 1000;
  }
}

/** A plain text turn: decode the answer, render turn k + 1 of the text twin without tools. */
function plainChain(tok: ChatTokenizer, c: Chain): void {
  const answers: RegeneratedAnswer[] = [];
  const { messages, turns } = c.plain;
  let previous: { promptIds: readonly number[]; history: ChatMessage[]; text?: string } = {
    promptIds: c.plain.firstIds,
    history: turnHistory(messages, turns, 1, []),
  };
  for (let k = 1; k < c.generated.length; k += 1) {
    const ids = (c.generated[k - 1] as GeneratedTurn).output_ids;
    answers.push({ outputIds: ids, message: answerMessage(tok, ids) });
    const hist = turnHistory(
      messages,
      turns,
      k + 1,
      answers.map((a) => a.message),
    );
    const prompt = renderTurnPrompt(tok, {
      history: hist,
      previous: { ...previous, answer: answers[k - 1] as RegeneratedAnswer },
    });
    previous = { promptIds: prompt.ids, history: hist, text: prompt.text };
  }
}

async function parseCost(tok: ChatTokenizer, chains: readonly Chain[], rounds: number): Promise<ParseCost> {
  // Once untimed: the JIT and the template's caches warm up.
  for (const c of chains) {
    await agenticChain(tok, c);
    plainChain(tok, c);
  }
  let turns = 0;
  let withCalls = 0;
  const all: { agentic: number; plain: number }[] = [];
  const partsAll: ParseCost['parts'][] = [];
  for (let r = 0; r < rounds; r += 1) {
    turns = 0;
    withCalls = 0;
    let t = performance.now();
    for (const c of chains) {
      const got = await agenticChain(tok, c);
      turns += got.turns;
      withCalls += got.withCalls;
    }
    const agenticMs = performance.now() - t;
    t = performance.now();
    for (const c of chains) plainChain(tok, c);
    const plainMs = performance.now() - t;
    const parts = { decodeUs: 0, parseUs: 0, matchUs: 0, renderUs: 0 };
    for (const c of chains) agenticParts(tok, c, parts);
    partsAll.push(parts);
    all.push({ agentic: round((agenticMs * 1000) / turns, 1), plain: round((plainMs * 1000) / turns, 1) });
  }
  const agentic = median(all.map((x) => x.agentic));
  const plain = median(all.map((x) => x.plain));
  const part = (key: keyof ParseCost['parts']) => round(median(partsAll.map((p) => p[key] / turns)), 1);
  return {
    turns,
    turnsWithCalls: withCalls,
    agenticUsPerTurn: agentic,
    parts: {
      decodeUs: part('decodeUs'),
      parseUs: part('parseUs'),
      matchUs: part('matchUs'),
      renderUs: part('renderUs'),
    },
    plainUsPerTurn: plain,
    ratio: round(agentic / Math.max(1e-9, plain), 3),
    rounds: all,
  };
}

/** The generated conversations of the agentic run, each with its turns 1..n in order (n ≥ 2). */
function chainsOf(tok: ChatTokenizer, env: BenchEnv, records: readonly AgenticRecord[]): Chain[] {
  const gen = readGenerations(path.join(env.dir, 'out', 'agentic'), 'ag') as unknown as GeneratedTurn[];
  const byConv = new Map<string, GeneratedTurn[]>();
  for (const g of gen) {
    const list = byConv.get(g.conversation_id) ?? [];
    list.push(g);
    byConv.set(g.conversation_id, list);
  }
  const source = new Map(records.map((r) => [r.id, r]));
  const out: Chain[] = [];
  for (const [id, list] of byConv) {
    const rec = source.get(id);
    if (rec === undefined) continue;
    list.sort((a, b) => a.turn - b.turn);
    // Its turns 1..n with none missing (the run was stopped in the middle of some).
    let n = 0;
    while (n < list.length && (list[n] as GeneratedTurn).turn === n + 1) n += 1;
    if (n < 2) continue;
    const { messages, turns } = parsed(rec);
    out.push({
      messages,
      turns,
      tools: rec.tools,
      plain: plainTwin(tok, messages, turns),
      generated: list.slice(0, n),
    });
  }
  return out;
}

/**
 * The single-turn case: one prompt per agentic turn, conversation after conversation. The
 * simulator answers a prompt that offers tools with the calls of its plan's first round and one
 * without tools with text of the drawn length, so a turn with calls becomes a prompt with the
 * tools (a task, then words) and a final answer a prompt without; each is padded to the mean
 * length of the agentic turns' prompts (each turn's source history rendered with the tools).
 */
function singleTurnPrompts(
  tok: ChatTokenizer,
  records: readonly AgenticRecord[],
): { records: object[]; targetTokens: number } {
  let sum = 0;
  let n = 0;
  // The mean over the first 200 conversations (the plans are drawn the same way for all).
  for (const rec of records.slice(0, 200)) {
    const { messages, turns } = parsed(rec);
    for (const start of turns.starts) {
      sum += tok.encodePrompt(messages.slice(0, start), { tools: rec.tools }).length;
      n += 1;
    }
  }
  const targetTokens = Math.round(sum / Math.max(1, n));
  const system = { role: 'system', content: 'You are a software engineering agent. Use the tools.' };
  const probe = tok.encodePrompt([{ role: 'user', content: longPrompt(0, 4000) }]).length;
  const charsPerToken = 4000 / probe;
  const padded = (task: string, tools: unknown[] | undefined): object[] => {
    const base = tok.encodePrompt([system, { role: 'user', content: task }] as ChatMessage[], {
      ...(tools === undefined ? {} : { tools }),
    }).length;
    const chars = Math.max(0, Math.round((targetTokens - base) * charsPerToken));
    return [system, { role: 'user', content: chars === 0 ? task : `${task} ${longPrompt(task.length, chars)}` }];
  };
  const out: object[] = [];
  for (const [i, rec] of records.entries()) {
    const { turns } = parsed(rec);
    const n = turns.starts.length;
    for (let k = 1; k <= n; k += 1) {
      const task = `Task ${i}.${k}: fix the failing test in module ${(i + k) % 5} (case ${i * 7 + k}).`;
      out.push(
        k < n
          ? { id: `${rec.id}-t${k}`, messages: padded(task, rec.tools), tools: rec.tools }
          : { id: `${rec.id}-t${k}`, messages: padded(task, undefined) },
      );
    }
  }
  return { records: out, targetTokens };
}

export async function agenticThroughput(
  o: AgenticThroughputOptions = DEFAULT_AGENTIC_THROUGHPUT,
): Promise<BenchResult> {
  const started = performance.now();
  const env = await openBenchEnv('agentic-throughput');
  try {
    const records = agenticRecords('ag', o.conversations, o.parallel);
    writeAgentic(env.dir, 'ag', records);
    const tok = await loadTokenizer(bundledTokenizerPath());
    const singles = singleTurnPrompts(tok, records);
    writePrompts(env.dir, 'ag-single', singles.records.length, (i) => singles.records[i] as object);
    const turnsInAll = singles.records.length;

    const single = await runThroughput(env, o, 'single-turn', turnsInAll);
    const agentic = await runThroughput(env, o, 'agentic', turnsInAll);
    const throughputRatio = agentic.tokensPerSimS / Math.max(1e-9, single.tokensPerSimS);

    const chains: Chain[] = [];
    let chainTurns = 0;
    for (const c of chainsOf(tok, env, records)) {
      if (chainTurns >= o.parseTurns) break;
      chains.push(c);
      chainTurns += c.generated.length - 1;
    }
    const cost = await parseCost(tok, chains, o.parseRounds);
    const latencyUs = agentic.meanLatencySimS * 1e6;
    const wallLatencyUs = agentic.meanLatencyWallS * 1e6;
    const shareReal = cost.agenticUsPerTurn / Math.max(1e-9, latencyUs);
    const shareRun = cost.agenticUsPerTurn / Math.max(1e-9, wallLatencyUs);

    const summary = [
      `throughput: ${o.conversations} agentic conversations (${fmtInt(turnsInAll)} turns, 4 tools, parallel rounds ${o.parallel}) against ${fmtInt(turnsInAll)} single-turn prompts (a prompt with the tools, answered with calls, for each turn with calls; one without, answered with text, for each final answer; ${fmtInt(singles.targetTokens)} tokens each, the turns' mean), final answers ${o.outputMin}-${o.outputMax} tokens, ${o.slots} slots, timeScale ${o.timeScale}; window ${o.windowSimS} simulated s after ${o.warmupSimS} s`,
      ...[single, agentic].map(
        (r) =>
          `${r.kind}: ${fmtInt(r.tokensPerSimS)} output tok/s (simulated), ${r.meanRunning}/${o.slots} running, mean prompt ${fmtInt(r.meanPromptTokens)} tokens, ${fmtInt(r.requestsFinished)} requests answered in the window (${r.meanOutputTokens} tokens each, mean latency ${r.meanLatencySimS} simulated s), CPU node ${r.cpu.nodeCores} + redis ${r.cpu.redisCores ?? '?'} cores`,
      ),
      `agentic / single-turn: ${throughputRatio.toFixed(3)}`,
      `parse cost: ${fmtInt(cost.turns)} generated turns followed by another (${fmtInt(cost.turnsWithCalls)} with calls), ${chains.length} conversations, median of ${o.parseRounds} rounds`,
      `agentic turn ${cost.agenticUsPerTurn} µs (decode ${cost.parts.decodeUs}, parse ${cost.parts.parseUs}, match ${cost.parts.matchUs}, render ${cost.parts.renderUs}); plain text turn ${cost.plainUsPerTurn} µs; ratio ${cost.ratio}`,
      `share of the mean turn latency: ${(shareReal * 100).toFixed(3)} % at the simulator's speed (${agentic.meanLatencySimS} s), ${(shareRun * 100).toFixed(2)} % of the run's wall latency (${agentic.meanLatencyWallS} s at timeScale ${o.timeScale})`,
    ];
    const met = throughputRatio >= o.targetThroughputRatio;
    return {
      name: 'agentic-throughput',
      ok: met,
      targets: [
        {
          what: 'agentic multi-turn output tokens/s / single-turn',
          required: `>= ${o.targetThroughputRatio}`,
          measured: throughputRatio.toFixed(3),
          met,
        },
      ],
      metrics: {
        config: o,
        turnsInAll,
        throughput: { single, agentic },
        throughputRatio: round(throughputRatio, 4),
        parseCost: {
          ...cost,
          conversations: chains.length,
          shareOfTurnLatencySim: round(shareReal, 6),
          shareOfTurnLatencyRunWall: round(shareRun, 5),
        },
      },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => agenticThroughput());
