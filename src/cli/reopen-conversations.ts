/**
 * `tokenmill retry-failed` for conversations regenerated turn by turn (`turns: all`): a
 * conversation that ended early for a cause that may pass — a turn that failed at the server
 * (`failed`), an error of the chat template, tokenizer or data (`error`), a history that could not
 * be read back (`history-lost`) — is reopened, and the next pass resumes it at its next turn on
 * exactly the history its committed turns had. That history is read back from the generation
 * files (and the results not yet written to them), since Redis drops a conversation's history
 * once it ends (docs/multi-turn.md). One that outgrew the context (`context`) stays ended: it would
 * end the same way again.
 */
import { createReadStream } from 'node:fs';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { createInterface } from 'node:readline';
import type { Redis } from 'ioredis';
import { withScripts, type RunKeys } from '../shared/index.js';
import { endCause } from '../workers/index.js';

/** Causes of an early end that `retry-failed` resumes. */
export const RESUMABLE_CAUSES: ReadonlySet<string> = new Set(['failed', 'error', 'history-lost', 'tool-executor']);

export interface ReopenOutcome {
  /** Conversations reopened: the next pass resumes each at its next turn. */
  reopened: number;
  /** Ended for a cause that would end them again (`context`): left ended. */
  kept: number;
}

interface Ended {
  raw: string;
  cause: string;
}

/** Reopens the dataset's conversations that ended early for a resumable cause (see the module comment). */
export async function reopenEndedConversations(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
  runDir: string,
): Promise<ReopenOutcome> {
  const ended = new Map<string, Ended>();
  let kept = 0;
  let cursor = '0';
  do {
    const [next, flat] = await redis.hscan(keys.conversations(dataset), cursor, 'COUNT', 1000);
    cursor = next;
    for (let i = 0; i + 1 < flat.length; i += 2) {
      const id = flat[i] as string;
      const raw = flat[i + 1] as string;
      const end = parseEnd(raw);
      if (end?.kind !== 'ended') continue;
      const cause = endCause(end.reason);
      if (RESUMABLE_CAUSES.has(cause)) ended.set(id, { raw, cause });
      else kept += 1;
    }
  } while (cursor !== '0');
  if (ended.size === 0) return { reopened: 0, kept };

  const turns = await committedTurns(redis, keys, dataset, runDir, ended);
  const r = withScripts(redis);
  let reopened = 0;
  for (const [id, e] of ended) {
    const found = turns.get(id) ?? new Map<number, string>();
    // The committed turns in order, 1..m; the driver takes a gap for a lost history and ends it again.
    const args: (string | number)[] = [];
    for (let k = 1; found.has(k); k += 1) args.push(k, found.get(k) as string);
    reopened += await r.reopenConversation(
      keys.conversations(dataset),
      keys.stats(dataset),
      keys.conversationHistory(dataset, id),
      keys.producer(dataset),
      id,
      e.raw,
      e.cause,
      ...args,
    );
  }
  return { reopened, kept };
}

function parseEnd(raw: string): { kind?: string; reason?: string } | undefined {
  try {
    const v: unknown = JSON.parse(raw);
    return typeof v === 'object' && v !== null ? (v as { kind?: string; reason?: string }) : undefined;
  } catch {
    return undefined;
  }
}

/** Turn → output ids (as JSON) of the given conversations: the generation files, then the results still in Redis. */
async function committedTurns(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
  runDir: string,
  wanted: ReadonlyMap<string, unknown>,
): Promise<Map<string, Map<number, string>>> {
  const out = new Map<string, Map<number, string>>();
  const take = (line: string): void => {
    // Most lines are other conversations' turns: parsed only when they name one that is wanted.
    if (!line.includes('"conversation_id"')) return;
    let r: { conversation_id?: unknown; turn?: unknown; output_ids?: unknown };
    try {
      r = JSON.parse(line) as typeof r;
    } catch {
      return; // a torn last line of a file being written: the sink writes it again
    }
    if (typeof r.conversation_id !== 'string' || !wanted.has(r.conversation_id)) return;
    if (typeof r.turn !== 'number' || !Array.isArray(r.output_ids)) return;
    const turns = out.get(r.conversation_id) ?? new Map<number, string>();
    turns.set(r.turn, JSON.stringify(r.output_ids));
    out.set(r.conversation_id, turns);
  };
  const dir = path.join(runDir, dataset, 'generations');
  const files = (await readdir(dir).catch(() => [] as string[])).filter((f) => f.endsWith('.jsonl')).sort();
  for (const f of files) {
    const lines = createInterface({ input: createReadStream(path.join(dir, f)), crlfDelay: Infinity });
    for await (const line of lines) take(line);
  }
  let from = '-';
  for (;;) {
    const page = await redis.xrange(keys.results(dataset), from, '+', 'COUNT', 1000);
    for (const [, fields] of page) {
      const i = fields.indexOf('r');
      if (i >= 0 && fields[i + 1] !== undefined) take(fields[i + 1] as string);
    }
    if (page.length < 1000) break;
    from = `(${(page[page.length - 1] as [string, string[]])[0]}`;
  }
  return out;
}
