import { createHash } from 'node:crypto';
import { mkdir, open, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import {
  conversationTurns,
  turnHistory,
  parseScannedLine,
  scanPromptFile,
  type ChatTokenizer,
  type DatasetConfig,
  type Logger,
  type PromptFileIndex,
  type PromptRecord,
  type RejectedLine,
  type RunKeys,
  type Sample,
  type ScannedLine,
  type ScriptedRedis,
} from '../shared/index.js';

/** Edited lines named one by one in the log per version of the file; the rest are counted. */
const EDITED_NAMED = 5;
/** Ids already warned about, per version of a prompt file (its index): a warning once, not every pass. */
const warnedEdits = new WeakMap<PromptFileIndex, Set<string>>();

/** 12 hex digits of SHA-256 over a prompt's messages: what {@link RunKeys.promptDigests} keeps. */
export function promptDigest(messages: unknown): string {
  return createHash('sha256').update(JSON.stringify(messages)).digest('hex').slice(0, 12);
}

/** Prompts checked against Redis at once while scanning a file. */
const SCAN_CHUNK = 1024;
/**
 * Prompts tokenized at once. Between two such pieces the pass yields to the event loop, so a
 * worker in the same process keeps sending requests and committing results while the
 * producer tokenizes (a whole scan chunk at once held the loop for 100 ms and more).
 */
export const ENCODE_CHUNK = 64;

export interface PassContext {
  redis: ScriptedRedis;
  keys: RunKeys;
  ds: DatasetConfig;
  file: string;
  /** The file's duplicate index (built once per version of the file). */
  index: PromptFileIndex;
  /** Ids of the dataset's eval split (`evalHoldout`): never enqueued, not counted as prompts. */
  heldOut?: ReadonlySet<string>;
  tokenizer: ChatTokenizer;
  contextLength: number | undefined;
  runDir: string;
  epoch: number;
  /** Lines up to this one were enqueued earlier in the epoch: checked, counted, not sent. */
  fromLine: number;
  log: Logger;
  isStopping(): boolean;
  /** Waits for room in the window and enqueues; false when the pass must end (budget, stop). */
  addBatch(samples: Sample[]): Promise<boolean>;
}

export interface PassResult {
  /** Samples enqueued. */
  enqueued: number;
  /** The pass read the whole file (not cut short by a stop or the budget). */
  complete: boolean;
  /** Valid, distinct prompts in the file (the eval split's left out). */
  valid: number;
  /** Lines of the eval split's ids passed over. */
  heldOut: number;
  rejected: number;
  /** Valid prompts already committed or failed when the pass reached them. */
  accounted: number;
}

interface Candidate {
  scanned: Exclude<ScannedLine, { kind: 'rejected' }>;
  id: string;
  line: number;
}

/**
 * One pass over a dataset's prompt file from line 1 (docs/design.md, invariants 1, 4, 5).
 *
 * Lines are checked against the done and failed sets in chunks before anything else is done
 * with them: a line whose id is accounted for is counted and skipped without parsing its
 * messages or tokenizing it (its id is read from the line's start when the line begins with
 * it), so the last pass over a 10M-line file costs a read and a set lookup per line.
 * Repeated ids are found by the file's {@link PromptFileIndex}, not by remembering every id.
 */
export async function runPass(ctx: PassContext): Promise<PassResult> {
  const { redis, keys, ds, file } = ctx;
  await mkdir(join(ctx.runDir, ds.name), { recursive: true });
  const rejectsFile = await open(join(ctx.runDir, ds.name, 'rejects.jsonl'), 'w');
  const result: PassResult = { enqueued: 0, complete: false, valid: 0, rejected: 0, accounted: 0, heldOut: 0 };
  let candidates: Candidate[] = [];
  let batch: Sample[] = [];
  /** Digests of the samples in `batch` whose id the file gives (id, digest, …), written once it is enqueued. */
  let digests: string[] = [];
  let edited = 0;
  const reject = async (r: RejectedLine): Promise<void> => {
    result.rejected += 1;
    await rejectsFile.write(`${JSON.stringify(r)}\n`);
  };
  const flushBatch = async (): Promise<boolean> => {
    if (batch.length === 0) return true;
    if (!(await ctx.addBatch(batch))) return false;
    result.enqueued += batch.length;
    batch = [];
    if (digests.length > 0) await redis.hset(keys.promptDigests(ds.name), ...digests);
    digests = [];
    return true;
  };
  const flushCandidates = async (): Promise<boolean> => {
    if (candidates.length === 0) return true;
    const ids = candidates.map((c) => c.id);
    const perPrompt = ds.samplesPerPrompt;
    const sampleIds = candidates.flatMap((c) => sampleIdsOf(c.id, perPrompt));
    // A conversation regenerated turn by turn is accounted for once it has finished (its turns
    // are committed one by one under their own ids).
    const [doneAll, failedAll, stored] = await Promise.all([
      ds.turns === 'all'
        ? redis.hmget(keys.conversations(ds.name), ...sampleIds).then((v) => v.map((x) => (x === null ? 0 : 1)))
        : redis.smismember(keys.done(ds.name), ...sampleIds),
      redis.hmget(keys.failed(ds.name), ...sampleIds),
      redis.hmget(keys.promptDigests(ds.name), ...ids),
    ]);
    // Per prompt: accounted for when every one of its samples is; else the samples still open.
    const open = candidates.map((_, i) =>
      sampleIds
        .slice(i * perPrompt, (i + 1) * perPrompt)
        .filter((_, j) => doneAll[i * perPrompt + j] !== 1 && failedAll[i * perPrompt + j] === null),
    );
    const done = candidates.map((_, i) => (doneAll[i * perPrompt] === 1 ? 1 : 0));
    const toSend: PromptRecord[] = [];
    const openOf = new Map<PromptRecord, string[]>();
    for (const [i, c] of candidates.entries()) {
      if ((open[i] ?? []).length === 0) {
        result.valid += 1;
        result.accounted += 1;
        const was = stored[i];
        if (done[i] === 1 && was !== null && was !== undefined) {
          const parsed = parseScannedLine(file, c.scanned, ctx.index.parse);
          const warned = warnedEdits.get(ctx.index) ?? new Set<string>();
          warnedEdits.set(ctx.index, warned);
          if (parsed.ok && !warned.has(c.id) && recordDigest(parsed.record) !== was) {
            warned.add(c.id);
            edited += 1;
            if (edited <= EDITED_NAMED) {
              ctx.log.warn(
                { dataset: ds.name, file, line: c.line, id: c.id },
                `${file}:${c.line}: the prompt with id ${JSON.stringify(c.id)} changed since it was generated; its old generation is kept. ` +
                  'To generate the new text too, give the line a new id; to keep the old answer, nothing to do',
              );
            }
          }
        }
        continue;
      }
      const parsed = parseScannedLine(file, c.scanned, ctx.index.parse);
      if (!parsed.ok) {
        await reject(parsed.reject);
        continue;
      }
      result.valid += 1;
      if (c.line <= ctx.fromLine) continue;
      toSend.push(parsed.record);
      openOf.set(parsed.record, open[i] ?? []);
    }
    candidates = [];
    // A piece of prompts at once (with server-side tokenization, one batched request each); a
    // full batch is enqueued as soon as its prompts are tokenized.
    for (let from = 0; from < toSend.length; from += ENCODE_CHUNK) {
      if (from > 0) await yieldToEventLoop();
      if (ctx.isStopping()) return false;
      const piece = toSend.slice(from, from + ENCODE_CHUNK);
      const encoded = await ctx.tokenizer.encodePrompts(
        piece.map((rec) => ({ messages: firstTurnMessages(ds, rec), tools: rec.tools })),
        ds.chatTemplateKwargs === undefined ? {} : { templateKwargs: ds.chatTemplateKwargs },
      );
      for (const [i, rec] of piece.entries()) {
        const sample = await toSample(ctx, rec, encoded[i] ?? new Error('not tokenized'), reject);
        if (sample === undefined) continue;
        // A content-hash id (`h:…`) changes with the content: only ids the file gives need a digest.
        if (!rec.id.startsWith('h:')) digests.push(rec.id, recordDigest(rec));
        for (const s of samplesOf(ds, sample, openOf.get(rec) ?? [sample.id])) {
          batch.push(s);
          if (batch.length >= ds.batchSize && !(await flushBatch())) return false;
        }
      }
    }
    return true;
  };
  try {
    for await (const chunk of scanPromptFile(file, ctx.index)) {
      if (ctx.isStopping()) return result;
      for (const scanned of chunk) {
        if (scanned.kind === 'rejected') {
          await reject(scanned.reject);
          continue;
        }
        const [id, line] =
          scanned.kind === 'unique' ? [scanned.id, scanned.line] : [scanned.record.id, scanned.record.line];
        // Held out for evaluation: never sent, whatever its line says now.
        if (ctx.heldOut?.has(id) === true) {
          result.heldOut += 1;
          continue;
        }
        candidates.push({ scanned, id, line });
        if (candidates.length >= SCAN_CHUNK && !(await flushCandidates())) return result;
      }
    }
    if (!(await flushCandidates()) || !(await flushBatch())) return result;
    if (edited > EDITED_NAMED) {
      ctx.log.warn(
        { dataset: ds.name, file, edited },
        `${file}: ${edited} prompts changed since they were generated (the first ${EDITED_NAMED} named above); their old generations are kept`,
      );
    }
    result.complete = true;
    await redis.hset(keys.stats(ds.name), 'rejected', result.rejected, 'prompts', result.valid);
    ctx.log.info(
      {
        epoch: ctx.epoch,
        fromLine: ctx.fromLine,
        enqueued: result.enqueued,
        rejected: result.rejected,
        accounted: result.accounted,
        heldOut: result.heldOut,
      },
      'pass over the prompts done',
    );
    return result;
  } finally {
    await closeQuietly(rejectsFile);
  }
}

async function toSample(
  ctx: PassContext,
  rec: PromptRecord,
  encoded: number[] | Error,
  reject: (r: RejectedLine) => Promise<void>,
): Promise<Sample | undefined> {
  if (encoded instanceof Error) {
    await reject({
      file: ctx.file,
      line: rec.line,
      id: rec.id,
      reason: `cannot render the chat template: ${encoded.message}`,
    });
    return undefined;
  }
  const promptIds = encoded;
  const ctxLen = ctx.contextLength;
  if (ctxLen !== undefined && promptIds.length >= ctxLen) {
    await reject({
      file: ctx.file,
      line: rec.line,
      id: rec.id,
      reason: `prompt has ${promptIds.length} tokens; the model's context length is ${ctxLen}`,
    });
    return undefined;
  }
  const maxNewTokens =
    ctxLen === undefined ? ctx.ds.maxNewTokens : Math.min(ctx.ds.maxNewTokens, ctxLen - promptIds.length);
  return {
    id: rec.id,
    line: rec.line,
    promptIds,
    maxNewTokens,
    ...(ctx.ds.turns === 'all' ? { messages: rec.messages } : {}),
    ...(rec.tools === undefined ? {} : { tools: rec.tools }),
  };
}

/** A record's digest: of its messages, and of its tools too when it has some (so a record without keeps its digest). */
function recordDigest(rec: PromptRecord): string {
  return promptDigest(rec.tools === undefined ? rec.messages : { messages: rec.messages, tools: rec.tools });
}

/** The sample ids of a prompt: its own id, or with `samplesPerPrompt: n` `<id>#s1` … `<id>#s<n>`. */
export function sampleIdsOf(id: string, perPrompt: number): string[] {
  if (perPrompt <= 1) return [id];
  return Array.from({ length: perPrompt }, (_, j) => `${id}#s${j + 1}`);
}

/** A prompt's open samples, each with its own id and, with `samplingVariants`, its own sampling settings. */
function samplesOf(ds: DatasetConfig, sample: Sample, open: readonly string[]): Sample[] {
  const variants = ds.samplingVariants;
  if (ds.samplesPerPrompt <= 1) {
    // One sample, under the prompt's own id: it is sample 1, with the first variant.
    const first = variants?.[0];
    return [first === undefined ? sample : { ...sample, sampling: first }];
  }
  return open.map((id) => {
    const j = Number(id.slice(id.lastIndexOf('#s') + 2));
    const variant = variants?.[(j - 1) % variants.length];
    return { ...sample, id, ...(variant === undefined ? {} : { sampling: variant }) };
  });
}

/** What turn 1 is rendered from: the record's chat, or with `turns: all` the history before its first turn. */
function firstTurnMessages(ds: DatasetConfig, rec: PromptRecord): PromptRecord['messages'] {
  if (ds.turns !== 'all') return rec.messages;
  const turns = conversationTurns(rec.messages);
  if (typeof turns === 'string') return rec.messages; // parsed records are checked already
  return turnHistory(rec.messages, turns, 1, []);
}

function yieldToEventLoop(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}

async function closeQuietly(f: FileHandle): Promise<void> {
  try {
    await f.close();
  } catch {
    // already closed
  }
}
