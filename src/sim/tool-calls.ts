/**
 * The simulated model's tool calls (docs/simulator.md, "Tool calls"). A prompt that offers tools
 * (tool-prompt.ts) is answered the way an agent works: a plan per request, a pure function of the
 * request's text and the tools offered ({@link agentPlan}), says how many rounds of calls it
 * makes and which tools each round calls; the model answers round k (its k-th answer since the
 * request) with those calls and, once the plan is done, with text. Per request, from its own
 * random stream (seed, rid, prompt length, as the other outputs), the configured rates perturb
 * it: no call where the plan calls (1 − `probability`), another tool's name or one the prompt
 * does not offer (`divergent`), arguments that are not JSON (`malformed`).
 *
 * A source conversation written by this plan (the demo's B8_sweagent) is what the model would
 * do again: its regenerated turns make the source's calls, but where a rate perturbs them.
 */
import { detectToolCallFormat, TOOL_CALL_FORMATS, type ToolCallFormat } from '../shared/index.js';
import { hashString, mulberry32, requestRng, type Rng } from './random.js';
import { composeAnswer } from './output-text.js';
import { datasetOfRid } from './speculative.js';
import { type OfferedTool, type ToolPrompt, readToolPrompt } from './tool-prompt.js';

/** How often each kind of tool-call answer happens. */
export interface ToolCallRates {
  /** The chance that an answer the plan makes with calls is made with calls (else text). */
  probability: number;
  /** The chance that a round of the plan makes 2–3 calls at once. */
  parallel: number;
  /** The chance that one call of an answer names another tool of the prompt's, or one it does not offer (half each). */
  divergent: number;
  /** The chance that one call of an answer has arguments that are not JSON. */
  malformed: number;
}

/** `toolCalls` of the simulator's options. */
export interface ToolCallOptions extends Partial<ToolCallRates> {
  /** The call format; default: the one the tokenizer's chat template teaches (none: no calls). */
  format?: ToolCallFormat;
  /** Rates for the requests whose rid names a dataset (as `speculative.perDataset`). */
  perDataset?: Record<string, Partial<ToolCallRates>>;
}

/** The defaults: every path taken now and then in a run of a few hundred calls, most conversations whole. */
export const DEFAULT_TOOL_CALL_RATES: Readonly<ToolCallRates> = {
  probability: 0.98,
  parallel: 0.2,
  divergent: 0.04,
  malformed: 0.02,
};

export interface ResolvedToolCalls {
  rates: ToolCallRates;
  format: ToolCallFormat | undefined;
  perDataset: ReadonlyMap<string, ToolCallRates>;
}

const RATE_KEYS = ['probability', 'parallel', 'divergent', 'malformed'] as const;

function rates(where: string, given: Partial<ToolCallRates>, base: ToolCallRates): ToolCallRates {
  const out = { ...base };
  for (const key of RATE_KEYS) {
    const value = given[key];
    if (value === undefined) continue;
    if (typeof value !== 'number' || !(value >= 0 && value <= 1))
      throw new RangeError(`simulator option ${where}.${key} must be a number in [0, 1], got ${String(value)}`);
    out[key] = value;
  }
  return out;
}

/** Checks `toolCalls` and applies the defaults. */
export function resolveToolCalls(o: ToolCallOptions | undefined): ResolvedToolCalls {
  const top = rates('toolCalls', o ?? {}, { ...DEFAULT_TOOL_CALL_RATES });
  const format = o?.format;
  if (format !== undefined && !TOOL_CALL_FORMATS.includes(format)) {
    throw new RangeError(
      `simulator option toolCalls.format must be one of ${TOOL_CALL_FORMATS.join(', ')}, got ${String(format)}`,
    );
  }
  const perDataset = new Map<string, ToolCallRates>();
  for (const [name, r] of Object.entries(o?.perDataset ?? {}))
    perDataset.set(name, rates(`toolCalls.perDataset.${name}`, r, top));
  return { rates: top, format, perDataset };
}

/** Tools that end an agent's work: called, if at all, in the plan's last round. */
const FINISHING = /submit|finish|final|done|complete/i;

/**
 * The rounds of calls an agent makes for `request` with `tools` (names, in the order offered):
 * each round the names it calls, in order. A pure function of the request's text and the tools:
 * with three tools or more, 2–7 rounds, the last one often the finishing tool (`submit`,
 * `finish`, …) when there is one; with one or two, one round (now and then two). A round calls
 * 2–3 tools at once with probability `parallel`.
 */
export function agentPlan(request: string, tools: readonly string[], parallel: number): string[][] {
  if (tools.length === 0) return [];
  const rng = mulberry32(hashString(`tool-plan\u0000${request.trim()}\u0000${tools.join('\u0000')}`));
  const finishing = tools.filter((t) => FINISHING.test(t));
  const working = tools.filter((t) => !FINISHING.test(t));
  const pool = working.length > 0 ? working : [...tools];
  const n = tools.length >= 3 ? 2 + Math.floor(rng() * 6) : rng() < 0.25 ? 2 : 1;
  const plan: string[][] = [];
  for (let i = 0; i < n; i++) {
    const finish = i === n - 1 && finishing.length > 0 && rng() < 0.75;
    const many = rng() < parallel;
    const k = finish ? 1 : many ? 2 + Math.floor(rng() * 2) : 1;
    plan.push(Array.from({ length: k }, () => (finish ? (finishing[0] as string) : pick(rng, pool))));
  }
  return plan;
}

function pick<T>(rng: Rng, list: readonly T[]): T {
  return list[Math.floor(rng() * list.length)] as T;
}

/** JSON as Python's `json.dumps` writes it (`", "`, `": "`), which is how the templates render calls. */
export function pythonJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(', ')}]`;
  if (typeof value === 'object' && value !== null) {
    return `{${Object.entries(value)
      .map(([k, v]) => `${JSON.stringify(k)}: ${pythonJson(v)}`)
      .join(', ')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

const WORDS = ['config', 'parser', 'router', 'cache', 'client', 'model', 'query', 'index', 'worker', 'utils'];
const COMMANDS = ['ls -la', 'git status', 'grep -rn "TODO" src', 'python -m pytest -q', 'npm test', 'cat README.md'];
const UNKNOWN_TOOLS = ['search_web', 'ask_user', 'python', 'open_browser', 'list_directory', 'get_time'];

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** A value for parameter `name` of JSON schema `schema`, drawn from `rng`. */
function valueFor(name: string, schema: unknown, rng: Rng): unknown {
  const s = isObject(schema) ? schema : {};
  if (Array.isArray(s.enum) && s.enum.length > 0) return pick(rng, s.enum);
  const type = Array.isArray(s.type) ? s.type[0] : s.type;
  switch (type) {
    case 'integer':
      return 1 + Math.floor(rng() * 120);
    case 'number':
      return Math.round(rng() * 1000) / 10;
    case 'boolean':
      return rng() < 0.5;
    case 'array':
      return rng() < 0.5 ? [] : [valueFor(name, s.items, rng)];
    case 'object':
      return {};
    default:
      if (/path|file|dir/i.test(name)) return `src/${pick(rng, WORDS)}/${pick(rng, WORDS)}.py`;
      if (/command|cmd|script/i.test(name)) return pick(rng, COMMANDS);
      if (/url/i.test(name)) return `https://example.com/${pick(rng, WORDS)}`;
      return Array.from({ length: 1 + Math.floor(rng() * 4) }, () => pick(rng, WORDS)).join(' ');
  }
}

/** Arguments for a call of `tool` (its required parameters, now and then an optional one). */
function argumentsFor(tool: OfferedTool | undefined, rng: Rng): Record<string, unknown> {
  const params = isObject(tool?.parameters) ? tool.parameters : {};
  const props = isObject(params.properties) ? params.properties : {};
  const required = new Set(Array.isArray(params.required) ? params.required : []);
  const args: Record<string, unknown> = {};
  for (const [name, schema] of Object.entries(props))
    if (required.has(name) || rng() < 0.3) args[name] = valueFor(name, schema, rng);
  return args;
}

/** One call of a simulated answer, as written and as the simulator meant it. */
export interface SimCall {
  name: string;
  arguments: Record<string, unknown>;
  /** Named otherwise than the plan says (another tool of the prompt's, or one it does not offer). */
  divergent: boolean;
  /** Its arguments are written as text that is not JSON. */
  malformed: boolean;
}

/** A simulated answer with calls: its text (ids are its encoding) and its calls. */
export interface ToolAnswer {
  text: string;
  calls: SimCall[];
}

/** Arguments written so that no JSON parser reads them. */
function brokenJson(args: Record<string, unknown>, rng: Rng): string {
  const json = pythonJson(args);
  if (json === '{}' || rng() < 0.5) return json.slice(0, -1); // no closing brace
  return `${json.slice(0, -1)}, }`; // a trailing comma
}

/** The text of an answer with `calls` in `format`, after an optional `preamble`. */
export function writeToolCalls(
  format: ToolCallFormat,
  calls: readonly SimCall[],
  options: { preamble?: string; firstIndex?: number; rng?: Rng } = {},
): string {
  const rng = options.rng ?? mulberry32(0);
  const args = (c: SimCall): string => (c.malformed ? brokenJson(c.arguments, rng) : pythonJson(c.arguments));
  const pre = options.preamble ?? '';
  switch (format) {
    case 'hermes': {
      const body = calls
        .map((c) => {
          const json = `{"name": ${JSON.stringify(c.name)}, "arguments": ${args(c)}}`;
          return `<tool_call>\n${json}\n</tool_call>`;
        })
        .join('\n');
      // One newline before the first call, as Qwen3's template renders a history's calls (and so
      // as the model learned to write them).
      return pre === '' ? body : `${pre}\n${body}`;
    }
    case 'llama3':
      return calls.map((c) => `{"name": ${JSON.stringify(c.name)}, "parameters": ${args(c)}}`).join('; ');
    case 'deepseekv3':
      return `${pre}<｜tool▁calls▁begin｜>${calls
        .map(
          (c) =>
            `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${c.name}\n\`\`\`json\n${args(c)}\n\`\`\`<｜tool▁call▁end｜>`,
        )
        .join('\n')}<｜tool▁calls▁end｜>`;
    case 'kimi_k2': {
      const first = options.firstIndex ?? 0;
      return `${pre}<|tool_calls_section_begin|>${calls
        .map(
          (c, i) =>
            `<|tool_call_begin|>functions.${c.name}:${first + i}<|tool_call_argument_begin|>${args(c)}<|tool_call_end|>`,
        )
        .join('')}<|tool_calls_section_end|>`;
    }
  }
}

/** What the tool caller needs of the simulator's tokenizer. */
export interface ToolCallerTokenizer {
  chatTemplateSource(): string | undefined;
  tokenToId(token: string): number | undefined;
  decode(ids: readonly number[], opts?: { skipSpecialTokens?: boolean }): string;
}

/** Decides, per request, whether the simulated model answers with calls, and writes them. */
export class ToolCaller {
  /** The format the model writes calls in; undefined: it writes none. */
  readonly format: ToolCallFormat | undefined;
  /** An id every prompt that offers tools holds (Qwen3's `<tool_call>`), to skip decoding the others. */
  private readonly markerId: number | undefined;
  private readonly enabled: boolean;

  constructor(
    private readonly o: ResolvedToolCalls,
    private readonly tok: ToolCallerTokenizer,
    private readonly seed: number,
  ) {
    this.format = o.format ?? detectToolCallFormat(tok.chatTemplateSource());
    this.markerId = this.format === 'hermes' ? tok.tokenToId('<tool_call>') : undefined;
    this.enabled = o.rates.probability > 0 || [...o.perDataset.values()].some((r) => r.probability > 0);
  }

  /** The rates of a request: its dataset's (named by its rid), else the simulator's. */
  ratesFor(rid: string): ToolCallRates {
    const dataset = datasetOfRid(rid);
    return (dataset === undefined ? undefined : this.o.perDataset.get(dataset)) ?? this.o.rates;
  }

  /** How the model answers prompt `promptIds` of request `rid`: with calls, or undefined (text). */
  answer(promptIds: readonly number[], rid: string): ToolAnswer | undefined {
    const format = this.format;
    if (format === undefined || !this.enabled) return undefined;
    if (this.markerId !== undefined && !promptIds.includes(this.markerId)) return undefined;
    const prompt = readToolPrompt(this.tok.decode(promptIds, { skipSpecialTokens: false }), format);
    if (prompt === undefined) return undefined;
    return this.answerTo(prompt, format, this.ratesFor(rid), requestRng(this.seed, rid, promptIds.length, 'tools'));
  }

  private answerTo(prompt: ToolPrompt, format: ToolCallFormat, r: ToolCallRates, rng: Rng): ToolAnswer | undefined {
    const names = prompt.tools.map((t) => t.name);
    const round = agentPlan(prompt.request, names, r.parallel)[prompt.rounds];
    if (round === undefined || rng() >= r.probability) return undefined;
    const calls: SimCall[] = round.map((name) => ({ name, arguments: {}, divergent: false, malformed: false }));
    if (rng() < r.divergent) {
      const call = pick(rng, calls);
      const others = names.filter((n) => n !== call.name);
      const unknown = UNKNOWN_TOOLS.filter((n) => !names.includes(n));
      call.name = others.length > 0 && (rng() < 0.5 || unknown.length === 0) ? pick(rng, others) : pick(rng, unknown);
      call.divergent = true;
    }
    for (const call of calls)
      call.arguments = argumentsFor(
        prompt.tools.find((t) => t.name === call.name),
        rng,
      );
    if (rng() < r.malformed) pick(rng, calls).malformed = true;
    const preamble = format !== 'llama3' && rng() < 0.5 ? firstSentence(composeAnswer(rng, 8)) : '';
    return { text: writeToolCalls(format, calls, { preamble, firstIndex: prompt.earlierCalls, rng }), calls };
  }
}

function firstSentence(text: string): string {
  const end = text.search(/[.?!](\s|$)/);
  return end < 0 ? text : text.slice(0, end + 1);
}
