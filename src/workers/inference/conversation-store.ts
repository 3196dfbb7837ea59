/**
 * The Redis side of conversations regenerated turn by turn: their history (written by
 * commit-sample-9.lua as each turn commits), which have finished, and their end
 * (finish-conversation-4.lua).
 */
import {
  PayloadError,
  parseChatMessage,
  type ChatMessage,
  type ChatTokenizer,
  type RunKeys,
  type ScriptedRedis,
} from '../../shared/index.js';
import type { ConversationEnd } from './conversation-driver.js';
import type { GenerateBatchDeps } from './processor.js';

/** A history entry: the output ids as commit-sample-9.lua wrote them (cjson writes an empty list as `{}`). */
function parseOutputIds(raw: string, where: string): number[] {
  const v: unknown = JSON.parse(raw);
  if (Array.isArray(v) && v.every((x) => typeof x === 'number')) return v as number[];
  if (typeof v === 'object' && v !== null && Object.keys(v).length === 0) return [];
  throw new PayloadError(`${where}: expected a list of token ids`);
}

/** Recorded tool results: a list of tool messages. */
function parseToolResults(raw: string, where: string): ChatMessage[] {
  const v: unknown = JSON.parse(raw);
  if (!Array.isArray(v)) throw new PayloadError(`${where}: expected a list of tool messages`);
  return v.map((m, i) => parseChatMessage(m, `${where}[${i}]`));
}

/** The conversation deps of a batch processor, over `redis`. */
export function conversationStore(
  redis: ScriptedRedis,
  keys: RunKeys,
  tokenizer: () => Promise<ChatTokenizer>,
): NonNullable<GenerateBatchDeps['conversations']> {
  return {
    tokenizer,
    finished: async (ds, ids) => (await redis.hmget(keys.conversations(ds), ...ids)).map((x) => x !== null),
    history: async (ds, id) => {
      const key = keys.conversationHistory(ds, id);
      const raw = await redis.hgetall(key);
      const out = new Map<number, number[]>();
      for (const [turn, ids] of Object.entries(raw)) {
        // Fields `r<k>` hold tool results (record-tool-results-2.lua), not a turn's output.
        if (/^\d+$/.test(turn)) out.set(Number(turn), parseOutputIds(ids, `${key} turn ${turn}`));
      }
      return out;
    },
    toolResults: {
      get: async (ds, id, turn) => {
        const raw = await redis.hget(keys.conversationHistory(ds, id), `r${turn}`);
        return raw === null ? undefined : parseToolResults(raw, `${keys.conversationHistory(ds, id)} r${turn}`);
      },
      record: async (ds, id, turn, results) => {
        const key = keys.conversationHistory(ds, id);
        const raw = await redis.recordToolResults(keys.conversations(ds), key, id, turn, JSON.stringify(results));
        return raw === null ? undefined : parseToolResults(raw, `${key} r${turn}`);
      },
    },
    finish: async (ds: string, id: string, end: ConversationEnd, failedTurnId?: string) => {
      await redis.finishConversation(
        keys.conversations(ds),
        keys.stats(ds),
        keys.failed(ds),
        keys.done(ds),
        id,
        JSON.stringify({ id, ...end, ts: new Date().toISOString() }),
        end.kind,
        failedTurnId ?? '',
        end.kind === 'ended' ? endCause(end.reason) : '',
      );
    },
  };
}

/** The cause of an early end, in one word: the reason's first word (`context: …`, `failed: …`, `error: …`, `history-lost`). */
export function endCause(reason: string | undefined): string {
  const m = /^([a-z-]+)/.exec(reason ?? '');
  return m?.[1] ?? 'other';
}
