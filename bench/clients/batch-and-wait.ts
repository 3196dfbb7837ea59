// The batch-and-wait client of the old one-off scripts: send `slots` requests, wait for every
// one of them, then send the next `slots`. With several servers each round is spread over them
// in turn. A budget stops it from starting another round once the tokens completed reach it.
import { randomBytes } from 'node:crypto';
import { createWriteStream, type WriteStream } from 'node:fs';
import { SglangClient, type SglangSamplingParams } from '../../src/shared/index.js';

/** A prompt already rendered to token ids. */
export interface TokenizedPrompt {
  id: string;
  inputIds: number[];
}

/** Options of {@link runBatchAndWait}. */
export interface BatchAndWaitOptions {
  /** SGLang base URLs; request `i` of a round goes to `urls[i % urls.length]`. */
  urls: string[];
  /** Requests per round, over all servers. */
  slots: number;
  prompts: readonly TokenizedPrompt[];
  samplingParams: SglangSamplingParams;
  /** JSONL file of the results (`{id, output_ids, completion_tokens, finish_reason}` a line); none when omitted. */
  outFile?: string;
  /** No round starts once the completed output tokens reach it. */
  budgetTokens?: number;
  /** Prefix of every request id; default `bw`. */
  ridPrefix?: string;
  requestTimeoutMs?: number;
  /** Called once a round's requests are sent, before waiting for them. */
  onRoundSent?: (round: number) => Promise<void> | void;
  /** Called after each round; returning false ends the run. */
  continueAfterRound?: (round: number, totals: BatchAndWaitTotals) => boolean;
}

/** What {@link runBatchAndWait} did. */
export interface BatchAndWaitTotals {
  completed: number;
  outputTokens: number;
  rounds: number;
  /** Prompts not sent: the budget was reached or the run was ended first. */
  unsent: number;
  wallMs: number;
}

function writeLine(out: WriteStream, line: string): Promise<void> {
  return new Promise((resolve, reject) => {
    out.write(line, (e) => (e ? reject(e) : resolve()));
  });
}

/** Runs rounds of `slots` requests until the prompts run out, the budget is reached or `continueAfterRound` says stop. */
export async function runBatchAndWait(o: BatchAndWaitOptions): Promise<BatchAndWaitTotals> {
  if (o.urls.length === 0) throw new Error('runBatchAndWait: urls is empty');
  const started = performance.now();
  const perServer = Math.ceil(o.slots / o.urls.length);
  // The options hold `sampling_params` as sent (the semaphore loop posts them as they are); the client takes the limit apart.
  const { max_new_tokens: maxNewTokens, ...samplingParams } = o.samplingParams;
  const clients = o.urls.map(
    (endpoint) =>
      new SglangClient({ endpoint, concurrency: perServer, requestTimeoutMs: o.requestTimeoutMs ?? 600_000 }),
  );
  const out = o.outFile === undefined ? undefined : createWriteStream(o.outFile, { flags: 'a' });
  const prefix = o.ridPrefix ?? 'bw';
  const totals: BatchAndWaitTotals = { completed: 0, outputTokens: 0, rounds: 0, unsent: 0, wallMs: 0 };
  let next = 0;
  try {
    while (next < o.prompts.length) {
      if (o.budgetTokens !== undefined && totals.outputTokens >= o.budgetTokens) break;
      const batch = o.prompts.slice(next, next + o.slots);
      next += batch.length;
      const sends = Promise.all(
        batch.map(async (p, i) => {
          const client = clients[i % clients.length] as SglangClient;
          const r = await client.generate({
            inputIds: p.inputIds,
            maxNewTokens,
            samplingParams,
            rid: `${prefix}/${p.id}#${randomBytes(4).toString('hex')}`,
          });
          totals.completed += 1;
          totals.outputTokens += r.completionTokens;
          if (out !== undefined) {
            await writeLine(
              out,
              `${JSON.stringify({ id: p.id, output_ids: r.outputIds, completion_tokens: r.completionTokens, finish_reason: r.finishReason })}\n`,
            );
          }
        }),
      );
      await o.onRoundSent?.(totals.rounds);
      await sends;
      totals.rounds += 1;
      if (o.continueAfterRound !== undefined && !o.continueAfterRound(totals.rounds, totals)) break;
    }
    totals.unsent = o.prompts.length - next;
    totals.wallMs = performance.now() - started;
    return totals;
  } finally {
    await Promise.all(clients.map((c) => c.close()));
    if (out !== undefined) await new Promise<void>((resolve) => out.end(resolve));
  }
}
