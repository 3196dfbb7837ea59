/**
 * Entry of a tokenize thread (tokenize-pool.ts): loads the tokenizer once, checks that it
 * renders and encodes as the main thread's does, then answers each batch of conversation lines
 * with their outcomes ({@link conversationLineOutcome}), in line order.
 */
import { parentPort, workerData } from 'node:worker_threads';

import { errorMessage, loadTokenizer } from '../../shared/index.js';
import { createTokenizeContext, type TokenizeContext } from './tokenize-context.js';
import { conversationLineOutcome, type ConversationLineOutcome } from './tokenize-conversations.js';
import {
  contextFingerprint,
  packOutcomes,
  type BatchRequest,
  type ThreadInit,
  type ThreadReply,
} from './tokenize-pool-messages.js';

function tokenizeBatch(request: BatchRequest, ctx: TokenizeContext): ConversationLineOutcome[] {
  // A repeated id within the batch is a duplicate whatever the earlier lines of the file say.
  const ids = new Set<string>();
  const known = (id: string): boolean => ids.has(id);
  return request.lines.map((text) => {
    const outcome = conversationLineOutcome(text, ctx, known);
    if (outcome.kind !== 'unparsed') ids.add(outcome.id);
    return outcome;
  });
}

async function main(): Promise<void> {
  const port = parentPort;
  if (port === null) throw new Error('tokenize-pool-thread.ts runs as a worker thread of tokenize-pool.ts');
  const init = workerData as ThreadInit;
  const reply = (message: ThreadReply, transfer: ArrayBuffer[] = []): void => port.postMessage(message, transfer);
  let ctx: TokenizeContext;
  try {
    const tokenizer = await loadTokenizer(init.tokenizerDir, {
      kind: init.kind,
      ...(init.pattern === undefined ? {} : { pattern: init.pattern }),
      ...(init.preset === undefined ? {} : { preset: init.preset }),
    });
    ctx = createTokenizeContext(tokenizer, {
      keepTruncated: init.keepTruncated,
      ...(init.templateKwargs === undefined ? {} : { templateKwargs: init.templateKwargs }),
    });
  } catch (e: unknown) {
    reply({ type: 'failed', message: errorMessage(e) });
    return;
  }
  const fingerprint = contextFingerprint(ctx);
  if (fingerprint !== init.fingerprint) {
    reply({
      type: 'mismatch',
      detail: `the thread's tokenizer (${init.tokenizerDir}) renders or encodes a probe differently`,
    });
    return;
  }
  port.on('message', (request: BatchRequest) => {
    const { packed, transfer } = packOutcomes(request.batch, tokenizeBatch(request, ctx));
    reply({ type: 'result', result: packed }, transfer);
  });
  reply({ type: 'ready' });
}

await main();
