/**
 * What the main thread and the tokenize threads of tokenize-pool.ts say to each other, and how
 * a batch's line outcomes travel: token ids and masks packed in one `Int32Array` and one
 * `Uint8Array` per batch, moved (transferred), not copied.
 */
import { errorMessage, type ChatMessage, type TokenizerPreset } from '../../shared/index.js';
import type { ConversationLineOutcome } from './tokenize-conversations.js';
import type { TokenizeContext } from './tokenize-context.js';

/** `workerData` of a tokenize thread: how to build the same tokenize context as the main thread. */
export interface ThreadInit {
  tokenizerDir: string;
  /** The main thread's encoder (`tokenizer.kind` as resolved). */
  kind: 'huggingface' | 'tiktoken';
  /** `tokenizer.pattern` / `tokenizer.preset` as the main thread was given them. */
  pattern?: string;
  preset?: TokenizerPreset;
  keepTruncated: boolean;
  templateKwargs?: Record<string, unknown>;
  /** The main thread's {@link contextFingerprint}; the thread refuses to start on another. */
  fingerprint: string;
}

/** Main → thread: the lines of one batch (not blank), in file order. */
export interface BatchRequest {
  batch: number;
  lines: string[];
}

/** Thread → main. */
export type ThreadReply =
  | { type: 'ready' }
  /** The thread's tokenizer or template behaves differently from the main thread's. */
  | { type: 'mismatch'; detail: string }
  /** The thread could not load its tokenizer. */
  | { type: 'failed'; message: string }
  | { type: 'result'; result: PackedOutcomes };

const KIND_CODES = { unparsed: 0, repeated: 1, failed: 2, tokenized: 3 } as const;

/** The outcomes of one batch's lines, packed for `postMessage`. */
export interface PackedOutcomes {
  batch: number;
  /** Per line: 0 unparsed, 1 repeated, 2 failed, 3 tokenized. */
  kinds: Uint8Array;
  /** Per line: the record's id ("" when unparsed). */
  ids: string[];
  /** Per line: why it is invalid ("" when it is not). */
  reasons: string[];
  supervised: Int32Array;
  spanCountMismatch: Uint8Array;
  /** Line i's tokens are `tokens[tokenStarts[i] .. tokenStarts[i + 1])`. */
  tokenStarts: Int32Array;
  tokens: Int32Array;
  masks: Uint8Array;
}

/** Packs a batch's outcomes; `transfer` lists the buffers to move with the message. */
export function packOutcomes(
  batch: number,
  outcomes: readonly ConversationLineOutcome[],
): { packed: PackedOutcomes; transfer: ArrayBuffer[] } {
  const n = outcomes.length;
  let total = 0;
  for (const o of outcomes) if (o.kind === 'tokenized') total += o.input_ids.length;
  const packed: PackedOutcomes = {
    batch,
    kinds: new Uint8Array(n),
    ids: new Array<string>(n),
    reasons: new Array<string>(n),
    supervised: new Int32Array(n),
    spanCountMismatch: new Uint8Array(n),
    tokenStarts: new Int32Array(n + 1),
    tokens: new Int32Array(total),
    masks: new Uint8Array(total),
  };
  let at = 0;
  for (let i = 0; i < n; i++) {
    const o = outcomes[i];
    if (o === undefined) continue;
    packed.kinds[i] = KIND_CODES[o.kind];
    packed.ids[i] = o.kind === 'unparsed' ? '' : o.id;
    packed.reasons[i] = o.kind === 'unparsed' || o.kind === 'failed' ? o.reason : '';
    packed.tokenStarts[i] = at;
    if (o.kind === 'tokenized') {
      packed.tokens.set(o.input_ids, at);
      packed.masks.set(o.loss_mask, at);
      at += o.input_ids.length;
      packed.supervised[i] = o.supervised;
      packed.spanCountMismatch[i] = o.spanCountMismatch ? 1 : 0;
    }
  }
  packed.tokenStarts[n] = at;
  return { packed, transfer: [packed.tokens.buffer as ArrayBuffer, packed.masks.buffer as ArrayBuffer] };
}

/** Line `i`'s outcome out of a packed batch. */
export function unpackOutcome(p: PackedOutcomes, i: number): ConversationLineOutcome {
  const id = p.ids[i] ?? '';
  switch (p.kinds[i]) {
    case KIND_CODES.unparsed:
      return { kind: 'unparsed', reason: p.reasons[i] ?? '' };
    case KIND_CODES.repeated:
      return { kind: 'repeated', id };
    case KIND_CODES.failed:
      return { kind: 'failed', id, reason: p.reasons[i] ?? '' };
    default: {
      const start = p.tokenStarts[i] ?? 0;
      const n = (p.tokenStarts[i + 1] ?? start) - start;
      const inputIds = new Array<number>(n);
      const lossMask = new Array<number>(n);
      for (let k = 0; k < n; k++) {
        inputIds[k] = p.tokens[start + k] ?? 0;
        lossMask[k] = p.masks[start + k] ?? 0;
      }
      return {
        kind: 'tokenized',
        id,
        input_ids: inputIds,
        loss_mask: lossMask,
        supervised: p.supervised[i] ?? 0,
        spanCountMismatch: p.spanCountMismatch[i] === 1,
      };
    }
  }
}

const PROBE_TEXT = 'Probe: mixed text 123, 中文, emoji 😀, <|im_start|> and spaces   \n\n';
const PROBE_CONVERSATION: ChatMessage[] = [
  { role: 'system', content: 'probe system' },
  { role: 'user', content: 'probe question' },
  { role: 'assistant', content: 'probe answer', reasoning_content: 'probe reasoning' },
  { role: 'user', content: 'probe follow-up' },
  { role: 'assistant', content: 'probe second answer' },
];

/**
 * What must be the same in a tokenize thread and the main thread: the derived turn format,
 * the ids of a probe text and the rendering of a probe conversation. A thread whose tokenizer
 * folder loads differently (a setting only the main thread knows) is not used.
 */
export function contextFingerprint(ctx: TokenizeContext): string {
  let rendered: string;
  try {
    rendered = ctx.tokenizer.applyChatTemplate(PROBE_CONVERSATION, {
      addGenerationPrompt: false,
      templateKwargs: ctx.templateKwargs,
    });
  } catch (e: unknown) {
    rendered = `error: ${errorMessage(e)}`;
  }
  return JSON.stringify({
    name: ctx.tokenizer.name,
    vocabSize: ctx.tokenizer.vocabSize,
    format: ctx.format,
    ids: ctx.tokenizer.encode(PROBE_TEXT),
    rendered,
  });
}
