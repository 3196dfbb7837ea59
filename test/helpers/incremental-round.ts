// Post-process rounds run by calling the processors directly (no Redis: the tokenize job's
// result goes straight to the merge), on real generation files, a real tokenizer and a real
// training dataset folder. Used by the incremental-* tests; `incremental-merge-child.ts` runs the
// merge half in a process that a crash point kills.
import { appendFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';

import {
  bundledTokenizerPath,
  createRootLogger,
  loadTokenizer,
  type ChatTokenizer,
  type Logger,
  type MergeJobResult,
} from '../../src/shared/index.js';
import {
  processMerge,
  processTokenize,
  type MergeDeps,
  type TokenizeJobResult,
} from '../../src/workers/postprocess/processor.js';
import { createTokenizeContext, type TokenizeContext } from '../../src/workers/postprocess/tokenize.js';
import type { GenerationRecord } from './pipeline.js';

let tokenizer: Promise<ChatTokenizer> | undefined;

/** The bundled Qwen3 tokenizer, loaded once per test file. */
export function bundledTokenizer(): Promise<ChatTokenizer> {
  tokenizer ??= loadTokenizer(bundledTokenizerPath());
  return tokenizer;
}

/** A generation record as the results sink writes it, with real Qwen3 ids. */
export function generationRecord(
  tok: ChatTokenizer,
  dataset: string,
  id: string,
  finish: 'stop' | 'length' = 'stop',
): GenerationRecord {
  const promptIds = tok.encodePrompt([
    { role: 'user', content: `Question ${id} of ${dataset}: what is ${id.length} squared?` },
  ]);
  const imEnd = tok.tokenToId('<|im_end|>') ?? -1;
  const answer = tok.encode(`The answer to ${id} is ${id.length * id.length}.`);
  const outputIds = finish === 'stop' ? [...answer, imEnd] : answer;
  return {
    id,
    dataset,
    prompt_ids: promptIds,
    output_ids: outputIds,
    prompt_tokens: promptIds.length,
    completion_tokens: outputIds.length,
    finish_reason: finish === 'stop' ? { type: 'stop', matched: imEnd } : { type: 'length', length: outputIds.length },
    endpoint: 'http://127.0.0.1:30000',
    worker: 'test',
    attempt: 1,
    ts: new Date().toISOString(),
  };
}

/** `<runDir>/<dataset>/generations`. */
export function generationsDir(runDir: string, dataset: string): string {
  return path.join(runDir, dataset, 'generations');
}

/** Appends records to a part file, as the sink does (complete lines). */
export function appendRecords(
  runDir: string,
  dataset: string,
  part: number,
  records: readonly GenerationRecord[],
): string {
  const dir = generationsDir(runDir, dataset);
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `part-${String(part).padStart(5, '0')}.jsonl`);
  appendFileSync(file, records.map((r) => `${JSON.stringify(r)}\n`).join(''));
  return file;
}

export interface RoundSetup {
  runDir: string;
  target: string;
  datasets: readonly string[];
  keepTruncated?: boolean;
  logger?: Logger;
}

let counter = 0;

/** The tokenize jobs of one round, one per dataset, in this process. */
export async function tokenizeRound(
  s: RoundSetup,
  flowId = `inc-pp-${++counter}`,
): Promise<{ flowId: string; results: TokenizeJobResult[] }> {
  const tok = await bundledTokenizer();
  const ctx: TokenizeContext = createTokenizeContext(tok, { keepTruncated: s.keepTruncated ?? false });
  const logger = s.logger ?? createRootLogger({ level: 'silent' });
  const results: TokenizeJobResult[] = [];
  for (const dataset of s.datasets) {
    results.push(
      await processTokenize(
        {
          flowId,
          dataset,
          kind: 'generations',
          source: generationsDir(s.runDir, dataset),
          stagedDir: path.join(s.runDir, 'postprocess', flowId, dataset),
          target: s.target,
          shardSizeMiB: 1,
          maxInvalidFraction: 0,
        },
        { tokenizeContext: () => Promise.resolve(ctx), setPhase: () => Promise.resolve(), logger },
      ),
    );
  }
  return { flowId, results };
}

/** The merge job of a round whose tokenize jobs returned `results` (JSON round trip, as through Redis). */
export async function mergeRound(
  s: RoundSetup,
  flowId: string,
  results: readonly TokenizeJobResult[],
  merge?: MergeDeps['merge'],
): Promise<MergeJobResult> {
  const values = JSON.parse(JSON.stringify(results)) as unknown[];
  return processMerge(
    { flowId, target: s.target, runDir: s.runDir, shardSizeMiB: 1, mergeKey: `${flowId}/k` },
    {
      childResults: () => Promise.resolve(values),
      setPhase: () => Promise.resolve(),
      roundCompleted: () => Promise.resolve(),
      logger: s.logger ?? createRootLogger({ level: 'silent' }),
      ...(merge === undefined ? {} : { merge }),
    },
  );
}

/** Tokenize then merge. */
export async function fullRound(s: RoundSetup): Promise<{ results: TokenizeJobResult[]; merged: MergeJobResult }> {
  const { flowId, results } = await tokenizeRound(s);
  return { results, merged: await mergeRound(s, flowId, results) };
}
