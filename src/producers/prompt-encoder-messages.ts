/**
 * What the producer and its tokenize thread (prompt-encoder-thread.ts) say to each other. The
 * token ids of a piece of prompts travel packed in one `Int32Array`, moved, not copied.
 */
import type { ChatMessage, TokenizerPreset } from '../shared/index.js';

/** `workerData`: how to load the same tokenizer as the main thread, and what it must give for the probe. */
export interface EncoderThreadInit {
  dir: string;
  kind: 'huggingface' | 'tiktoken';
  pattern?: string;
  preset?: TokenizerPreset;
  /** The main thread's ids of {@link ENCODER_PROBE}; the thread refuses to start on others. */
  probeIds: number[];
}

/** Rendered and encoded on both threads before the thread takes any work. */
export const ENCODER_PROBE: readonly ChatMessage[] = [
  { role: 'system', content: 'You are a careful assistant.' },
  { role: 'user', content: 'Probe: Hello, world! 12345 你好，世界 🙂 def f(x): return x**2\n  indented\tand tabbed' },
];

/** Main → thread: a piece of prompts to render and encode. */
export interface EncodeRequest {
  id: number;
  conversations: (readonly ChatMessage[])[];
}

/** Thread → main. */
export type EncoderReply =
  | { type: 'ready' }
  | { type: 'failed'; message: string }
  | { type: 'mismatch'; detail: string }
  | { type: 'result'; id: number; packed: PackedIds };

/** Prompt i's ids are `tokens[starts[i] .. starts[i + 1])`; `errors[i]` is its template error, or null. */
export interface PackedIds {
  tokens: Int32Array;
  starts: Int32Array;
  errors: (string | null)[];
}

export function packIds(results: readonly (number[] | Error)[]): { packed: PackedIds; transfer: ArrayBuffer[] } {
  let total = 0;
  for (const r of results) if (!(r instanceof Error)) total += r.length;
  const tokens = new Int32Array(total);
  const starts = new Int32Array(results.length + 1);
  const errors: (string | null)[] = [];
  let at = 0;
  results.forEach((r, i) => {
    starts[i] = at;
    if (r instanceof Error) {
      errors.push(r.message);
      return;
    }
    tokens.set(r, at);
    at += r.length;
    errors.push(null);
  });
  starts[results.length] = at;
  return { packed: { tokens, starts, errors }, transfer: [tokens.buffer as ArrayBuffer, starts.buffer as ArrayBuffer] };
}

export function unpackIds(packed: PackedIds): (number[] | Error)[] {
  return packed.errors.map((err, i) => {
    if (err !== null) return new Error(err);
    return Array.from(packed.tokens.subarray(packed.starts[i] ?? 0, packed.starts[i + 1] ?? 0));
  });
}
