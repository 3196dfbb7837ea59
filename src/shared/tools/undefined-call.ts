/**
 * A regenerated call to a tool the record does not define ends the conversation: there is no
 * result the source could hold for it.
 */
import { isRecord } from '../util/index.js';
import type { ToolCall } from './types.js';

/** The names `tools` defines: OpenAI's `{type: 'function', function: {name}}` or a bare `{name}`. */
export function definedToolNames(tools: readonly unknown[]): Set<string> {
  const names = new Set<string>();
  for (const tool of tools) {
    if (!isRecord(tool)) continue;
    const fn = isRecord(tool.function) ? tool.function : tool;
    if (typeof fn.name === 'string') names.add(fn.name);
  }
  return names;
}

/**
 * `tool-unknown: turn <turn> called X, which the record's tools do not define` for the first of
 * `calls` whose tool `tools` does not define (`the turn called X` when `turn`, 1-based, is not
 * given); undefined when all are defined, or when the record has no structured tools to check
 * against (Hermes sources describe them in the system text).
 */
export function undefinedToolCall(
  calls: readonly ToolCall[],
  tools: readonly unknown[] | undefined,
  turn?: number,
): string | undefined {
  if (tools === undefined || tools.length === 0) return undefined;
  const names = definedToolNames(tools);
  const unknown = calls.find((c) => !names.has(c.function.name));
  if (unknown === undefined) return undefined;
  const which = turn === undefined ? 'the turn' : `turn ${String(turn)}`;
  return `tool-unknown: ${which} called ${unknown.function.name}, which the record's tools do not define`;
}
