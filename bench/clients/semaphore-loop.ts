// The hand-written client a user would write instead of tokenmill: a semaphore of `slots`
// requests in flight, POST /generate with input_ids straight on undici, one JSONL line per
// finished prompt. No Redis, no retries, no crash safety. Given prompts already tokenized, it is
// the floor of per-request overhead; given an `encode` function, each prompt is tokenized just
// before it is sent, as a user's loop that starts from the prompts file does.
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import { Pool } from 'undici';

/** One prompt: already tokenized, or its text (then `encode` tokenizes it). */
export interface LoopPrompt {
  id: string;
  inputIds?: number[];
  text?: string;
}

/** Options of {@link runSemaphoreLoop}. */
export interface SemaphoreLoopOptions {
  /** SGLang base URLs, used round-robin. */
  urls: string[];
  /** Requests in flight in all (the semaphore). */
  slots: number;
  prompts: LoopPrompt[];
  /** Sent as `sampling_params`; includes `max_new_tokens`. */
  samplingParams: Record<string, unknown>;
  /** JSONL, one `{id, output_ids, finish_reason}` a line. */
  outFile: string;
  /** Stop starting requests once finished requests' output tokens reach it. */
  budgetTokens?: number;
  /** Tokenizes a prompt given as text (its chat template and BPE), just before it is sent. */
  encode?: (text: string) => Promise<number[]>;
}

/** What {@link runSemaphoreLoop} did. */
export interface SemaphoreLoopResult {
  completed: number;
  outputTokens: number;
  wallMs: number;
}

interface GenerateBody {
  output_ids?: number[];
  meta_info?: { finish_reason?: unknown };
}

/** Sends every prompt (or until the budget is reached) with at most `slots` in flight. */
export async function runSemaphoreLoop(o: SemaphoreLoopOptions): Promise<SemaphoreLoopResult> {
  if (o.urls.length === 0) throw new Error('runSemaphoreLoop: urls is empty; give at least one SGLang base URL');
  if (!(o.slots >= 1)) throw new Error(`runSemaphoreLoop: slots must be at least 1, got ${o.slots}`);
  const perUrl = Math.max(1, Math.ceil(o.slots / o.urls.length));
  const pools = o.urls.map((u) => new Pool(new URL(u).origin, { connections: perUrl, keepAliveTimeout: 60_000 }));
  const paths = o.urls.map((u) => `${new URL(u).pathname.replace(/\/$/, '')}/generate`);
  const out = createWriteStream(o.outFile);
  const t0 = performance.now();
  let next = 0;
  let completed = 0;
  let outputTokens = 0;
  let drained: Promise<unknown> | undefined;

  const budgetReached = (): boolean => o.budgetTokens !== undefined && outputTokens >= o.budgetTokens;

  async function one(p: LoopPrompt, k: number): Promise<void> {
    const i = k % pools.length;
    let inputIds = p.inputIds;
    if (inputIds === undefined) {
      if (p.text === undefined || o.encode === undefined)
        throw new Error(`runSemaphoreLoop: prompt ${p.id} has neither inputIds nor text with an encode function`);
      inputIds = await o.encode(p.text);
    }
    const res = await pools[i]!.request({
      method: 'POST',
      path: paths[i]!,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ input_ids: inputIds, sampling_params: o.samplingParams, rid: p.id }),
    });
    if (res.statusCode !== 200) {
      const text = await res.body.text();
      throw new Error(`POST ${o.urls[i]}/generate for prompt ${p.id}: HTTP ${res.statusCode}: ${text.slice(0, 300)}`);
    }
    const body = (await res.body.json()) as GenerateBody;
    const ids = body.output_ids ?? [];
    completed += 1;
    outputTokens += ids.length;
    const line = `${JSON.stringify({ id: p.id, output_ids: ids, finish_reason: body.meta_info?.finish_reason ?? null })}\n`;
    if (!out.write(line)) {
      drained ??= once(out, 'drain').finally(() => {
        drained = undefined;
      });
    }
    if (drained !== undefined) await drained;
  }

  async function slot(): Promise<void> {
    while (next < o.prompts.length && !budgetReached()) {
      const k = next;
      next += 1;
      await one(o.prompts[k]!, k);
    }
  }

  try {
    await Promise.all(Array.from({ length: Math.min(o.slots, o.prompts.length) }, () => slot()));
  } finally {
    out.end();
    await once(out, 'close');
    await Promise.all(pools.map((p) => p.close()));
  }
  return { completed, outputTokens, wallMs: performance.now() - t0 };
}
