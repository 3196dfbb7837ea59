/**
 * The client of a dataset's tool executor (`datasets[].toolExecutor`, docs/agentic.md): the calls
 * a regenerated turn made are POSTed to it, and the conversation goes on with the results it
 * returns instead of the source's.
 *
 * Request: `POST <url>` with `{dataset, conversation_id, turn, calls: [{id, name, arguments}],
 * tools}` and the header `Idempotency-Key: <dataset>/<conversation>/<turn>`: a request sent again
 * (a retry after a timeout, or another worker after a crash between the call and the recording of
 * its result) carries the same key, so an executor that keeps its answers by key runs each call
 * once. Answer: `{results: [{tool_call_id, content}]}`, one per call (matched by id, or in order
 * when the ids are missing).
 *
 * Every wait is bounded: each attempt has `timeoutMs`; a timeout, a refused connection or a 5xx
 * is tried again, `attempts` times in all with a growing pause; a 4xx or an answer that does not
 * fit is not. What is left then is a {@link ToolExecutorError}: the conversation ends with its
 * message (cause `tool-executor`), which `tokenmill retry-failed` may reopen.
 */
import { Agent, request } from 'undici';
import { delay, errorMessage, type ChatMessage, type ToolCall } from '../../shared/index.js';

/** A dataset's `toolExecutor` setting, resolved. */
export interface ToolExecutorSettings {
  url: string;
  timeoutMs: number;
  attempts: number;
}

/** The executor could not give the results of a turn's calls (after its attempts). */
export class ToolExecutorError extends Error {
  override name = 'ToolExecutorError';
}

/** What one executor request is about. */
export interface ToolExecution {
  dataset: string;
  conversationId: string;
  turn: number;
  calls: readonly ToolCall[];
  tools: readonly unknown[] | undefined;
}

const RETRY_PAUSE_MS = 250;
const MAX_BODY_CHARS = 4_000_000;

/** One keep-alive pool for every executor request of the process. */
const agent = new Agent({ keepAliveTimeout: 10_000, connections: 64 });

/** Runs a turn's calls on the executor and returns the tool messages that answer them, in call order. */
export async function executeToolCalls(settings: ToolExecutorSettings, exec: ToolExecution): Promise<ChatMessage[]> {
  const body = JSON.stringify({
    dataset: exec.dataset,
    conversation_id: exec.conversationId,
    turn: exec.turn,
    calls: exec.calls.map((c) => ({ id: c.id, name: c.function.name, arguments: argumentsObject(c) })),
    tools: exec.tools ?? [],
  });
  const key = `${exec.dataset}/${exec.conversationId}/${exec.turn}`;
  let last = '';
  for (let attempt = 1; attempt <= settings.attempts; attempt += 1) {
    if (attempt > 1) await delay(RETRY_PAUSE_MS * 2 ** (attempt - 2));
    let status: number;
    let text: string;
    try {
      const res = await request(settings.url, {
        method: 'POST',
        dispatcher: agent,
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body,
        signal: AbortSignal.timeout(settings.timeoutMs),
        headersTimeout: settings.timeoutMs,
        bodyTimeout: settings.timeoutMs,
      });
      status = res.statusCode;
      text = await res.body.text();
    } catch (e: unknown) {
      last = timedOut(e) ? `no answer within ${settings.timeoutMs} ms` : errorMessage(e);
      continue;
    }
    if (status >= 500) {
      last = `HTTP ${status}: ${text.slice(0, 200)}`;
      continue;
    }
    if (status >= 400) throw new ToolExecutorError(`turn ${exec.turn}: HTTP ${status}: ${text.slice(0, 200)}`);
    return resultsOf(text, exec);
  }
  throw new ToolExecutorError(
    `turn ${exec.turn}: ${settings.url} failed ${settings.attempts} time${settings.attempts === 1 ? '' : 's'}: ${last}`,
  );
}

function timedOut(e: unknown): boolean {
  const name = e instanceof Error ? e.name : '';
  return name === 'TimeoutError' || name === 'AbortError' || /timeout/i.test(name);
}

function argumentsObject(call: ToolCall): unknown {
  const a = call.function.arguments;
  if (typeof a !== 'string') return a;
  try {
    return JSON.parse(a) as unknown;
  } catch {
    return a;
  }
}

/** The tool messages of an executor's answer, one per call in call order; a {@link ToolExecutorError} when it does not fit. */
function resultsOf(text: string, exec: ToolExecution): ChatMessage[] {
  const bad = (why: string) => new ToolExecutorError(`turn ${exec.turn}: the executor's answer ${why}`);
  if (text.length > MAX_BODY_CHARS) throw bad(`has ${text.length} characters, over ${MAX_BODY_CHARS}`);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e: unknown) {
    throw bad(`is not JSON: ${errorMessage(e)}`);
  }
  const results = (value as { results?: unknown } | null)?.results;
  if (!Array.isArray(results)) throw bad('has no "results" list');
  if (results.length !== exec.calls.length)
    throw bad(`has ${results.length} results for ${exec.calls.length} call${exec.calls.length === 1 ? '' : 's'}`);
  const byId = new Map<string, unknown>();
  for (const r of results) {
    const id = (r as { tool_call_id?: unknown } | null)?.tool_call_id;
    if (typeof id === 'string') byId.set(id, r);
  }
  return exec.calls.map((call, i) => {
    const r = (byId.get(call.id) ?? results[i]) as { content?: unknown } | null;
    const content = r?.content;
    if (content === undefined || content === null) throw bad(`gives no content for call ${call.id}`);
    return {
      role: 'tool' as const,
      tool_call_id: call.id,
      name: call.function.name,
      content: typeof content === 'string' ? content : JSON.stringify(content),
    };
  });
}
