/**
 * A record's tool schemas and ShareGPT's tool turns, read the same way by the prompt file reader
 * (source.ts) and by `prepare`'s sources (docs/agentic.md, "Tool schemas"):
 *
 * - `tools`: a list of OpenAI tool schemas `{type: "function", function: {name, description,
 *   parameters}}`, or a JSON string of one (glaive, xLAM); a bare function schema in it
 *   (`{name, description, parameters}`, xLAM's shape) is wrapped as `{type: "function", function}`;
 * - `functions` (read when there is no `tools`): a list, or a JSON string of one, of bare function
 *   schemas, each wrapped the same way;
 * - an empty list, or a blank string, is no tools (the record renders as one without them);
 * - a ShareGPT `function_call` turn (its value `{"name", "arguments"}` as JSON, or a list of
 *   them) is an assistant turn with structured `tool_calls`, each with an id (`call_<turn index>`,
 *   `call_<turn index>_<k>` for the k-th of several) unless the value has one; an `observation`
 *   turn is a `tool` turn, given the id of the call it answers.
 *
 * Schemas are kept as the source wrote them otherwise: the chat template renders them.
 */
import { PayloadError, errorMessage } from '../errors.js';
import { isRecord } from '../util/index.js';

/** A record's tool schemas, or why they cannot be read. */
export type RecordTools = { ok: true; tools: unknown[] | undefined } | { ok: false; reason: string };

/** A list, or a JSON string of one; a blank string is an empty list. */
function listOf(value: unknown, field: string): unknown[] | string {
  let v = value;
  if (typeof v === 'string') {
    if (v.trim() === '') return [];
    try {
      v = JSON.parse(v) as unknown;
    } catch (e: unknown) {
      return `"${field}" is a string that is not JSON: ${errorMessage(e)}`;
    }
    if (!Array.isArray(v)) return `"${field}" is a JSON string of ${kindOf(v)}: expected a list of tool schemas`;
    return v;
  }
  if (!Array.isArray(v)) return `"${field}" is ${kindOf(v)}: expected a list of tool schemas, or a JSON string of one`;
  return v;
}

function kindOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'an object';
  return `a ${typeof value}`;
}

/** `{type: "function", function: f}` for a bare function schema; an OpenAI tool schema as it is. */
function wrapped(schema: Record<string, unknown>): Record<string, unknown> {
  if (schema.type !== undefined || schema.function !== undefined) return schema;
  return { type: 'function', function: schema };
}

/**
 * The tool schemas of a record (or a source row): its `tools`, else its `functions` (see the
 * module comment). `undefined` when it has none; a reason for a value that is not a list of
 * objects, nor a JSON string of one.
 */
export function recordTools(rec: Readonly<Record<string, unknown>>): RecordTools {
  const field = rec.tools !== undefined && rec.tools !== null ? 'tools' : 'functions';
  const raw = rec[field];
  if (raw === undefined || raw === null) return { ok: true, tools: undefined };
  const list = listOf(raw, field);
  if (typeof list === 'string') return { ok: false, reason: list };
  const tools: unknown[] = [];
  for (const [i, schema] of list.entries()) {
    if (!isRecord(schema))
      return { ok: false, reason: `${field}[${i}] is ${kindOf(schema)}: expected a tool (function) schema object` };
    tools.push(wrapped(schema));
  }
  return { ok: true, tools: tools.length === 0 ? undefined : tools };
}

/**
 * The tool calls of a ShareGPT `function_call` turn: its value `{"name", "arguments"}` as JSON
 * (or a list of them), each as `{id, type: "function", function: {name, arguments}}`; the id is
 * the value's own, else `call_<index>` (`call_<index>_<k>` for the k-th of several). `arguments`
 * stay as given (an object, or a JSON string). Throws a {@link PayloadError} naming `where`.
 */
export function functionCallToolCalls(value: string, index: number, where: string): Record<string, unknown>[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(value) as unknown;
  } catch (e: unknown) {
    throw new PayloadError(`${where} is a function_call turn whose value is not JSON: ${errorMessage(e)}`, {
      cause: e,
    });
  }
  const calls = Array.isArray(parsed) ? parsed : [parsed];
  if (calls.length === 0) throw new PayloadError(`${where} is a function_call turn with no call`);
  return calls.map((call, k) => {
    const at = Array.isArray(parsed) ? `${where}[${k}]` : where;
    if (!isRecord(call) || typeof call.name !== 'string' || call.name === '')
      throw new PayloadError(`${at} is a function_call turn whose value is not {"name", "arguments"}`);
    const id =
      typeof call.id === 'string' && call.id !== '' ? call.id : `call_${index}${calls.length > 1 ? `_${k}` : ''}`;
    const args = call.arguments ?? call.parameters ?? {};
    return { id, type: 'function', function: { name: call.name, arguments: args } };
  });
}

/** The ids of tool calls (`[{id}, …]`), in order; those without one are left out. */
export function toolCallIds(toolCalls: readonly unknown[] | undefined): string[] {
  const ids: string[] = [];
  for (const c of toolCalls ?? []) if (isRecord(c) && typeof c.id === 'string') ids.push(c.id);
  return ids;
}
