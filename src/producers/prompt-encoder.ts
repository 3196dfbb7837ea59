/**
 * The producer's prompt encoder. Rendering the chat template and encoding a prompt costs about
 * 0.1 ms of CPU; under `tokenmill run` the producer shares its event loop with the inference
 * worker and the results sinks, so on a thread of its own that work runs beside theirs instead
 * of between them. Until the thread is ready, and for good once it fails, stops or encodes
 * the probe differently from the main thread's tokenizer, the main thread encodes: the same ids,
 * in the same order, either way. Server-side tokenization needs no thread (the server encodes).
 */
import type { Worker } from 'node:worker_threads';

import { errorMessage, logger as componentLogger, type ChatMessage, type ChatTokenizer, type Logger } from '../shared/index.js';
import { startModuleThread } from '../shared/module-thread.js';
import { ENCODER_PROBE, unpackIds, type EncodeRequest, type EncoderReply, type EncoderThreadInit } from './prompt-encoder-messages.js';

/** What the producer needs of a tokenizer: many prompts' ids at once, an Error for each the template rejects. */
export interface PromptEncoder {
  encodePrompts(conversations: readonly (readonly ChatMessage[])[]): Promise<(number[] | Error)[]>;
  /** Stops the thread, if any (what it still held is encoded on the main thread). */
  close(): Promise<void>;
}

interface Pending {
  conversations: (readonly ChatMessage[])[];
  resolve(ids: (number[] | Error)[]): void;
  reject(e: unknown): void;
}

/** The prompt encoder of a tokenizer: threaded for local encoders unless `thread` is false. */
export function promptEncoder(tokenizer: ChatTokenizer, opts: { thread?: boolean; logger?: Logger } = {}): PromptEncoder {
  const kind = tokenizer.encoderKind;
  if (opts.thread === false || kind === 'server') {
    return { encodePrompts: (c) => tokenizer.encodePrompts(c), close: () => Promise.resolve() };
  }
  return new ThreadedPromptEncoder(tokenizer, kind, opts.logger ?? componentLogger('producer'));
}

export class ThreadedPromptEncoder implements PromptEncoder {
  private worker: Worker | undefined;
  private ready = false;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;

  constructor(
    private readonly tokenizer: ChatTokenizer,
    kind: 'huggingface' | 'tiktoken',
    private readonly log: Logger,
  ) {
    let init: EncoderThreadInit;
    try {
      init = { dir: tokenizer.dir, kind, ...tokenizer.tiktokenOverrides, probeIds: tokenizer.encodePrompt(ENCODER_PROBE) };
    } catch (e: unknown) {
      this.log.debug({ err: e }, 'the probe conversation does not render with this template; prompts are encoded on the main thread');
      return;
    }
    const worker = startModuleThread(import.meta.url, 'prompt-encoder-thread', init);
    this.worker = worker;
    worker.unref();
    worker.on('message', (m: EncoderReply) => this.onReply(m));
    worker.on('error', (e) => this.abandon(`it failed: ${errorMessage(e)}`));
    worker.on('exit', (code) => this.abandon(`it exited (code ${code})`));
  }

  /** Whether pieces go to the thread now (tests). */
  get threaded(): boolean {
    return this.ready && this.worker !== undefined;
  }

  encodePrompts(conversations: readonly (readonly ChatMessage[])[]): Promise<(number[] | Error)[]> {
    const worker = this.worker;
    if (!this.ready || worker === undefined) return this.tokenizer.encodePrompts(conversations);
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      const request: EncodeRequest = { id, conversations: [...conversations] };
      this.pending.set(id, { conversations: request.conversations, resolve, reject });
      worker.postMessage(request);
    });
  }

  async close(): Promise<void> {
    const worker = this.worker;
    if (worker === undefined) return;
    this.abandon(undefined);
    await worker.terminate();
  }

  private onReply(m: EncoderReply): void {
    switch (m.type) {
      case 'ready':
        this.ready = this.worker !== undefined;
        return;
      case 'result': {
        const p = this.pending.get(m.id);
        if (p === undefined) return;
        this.pending.delete(m.id);
        p.resolve(unpackIds(m.packed));
        return;
      }
      case 'failed':
        this.abandon(`it could not encode: ${m.message}`);
        return;
      case 'mismatch':
        this.abandon(m.detail);
        return;
    }
  }

  /** Stops using the thread; what it held is encoded here. `why` undefined: a normal close. */
  private abandon(why: string | undefined): void {
    if (this.worker === undefined) return;
    const worker = this.worker;
    this.worker = undefined;
    this.ready = false;
    if (why !== undefined) {
      this.log.warn({ reason: why }, 'the producer\'s tokenize thread stopped; prompts are encoded on the main thread from now on');
      void worker.terminate();
    }
    const held = [...this.pending.values()];
    this.pending.clear();
    for (const p of held) this.tokenizer.encodePrompts(p.conversations).then(p.resolve, p.reject);
  }
}
