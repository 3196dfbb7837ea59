/**
 * Entry of the producer's tokenize thread (prompt-encoder.ts): loads the tokenizer once, checks
 * that it renders and encodes the probe as the main thread does, then answers each piece of
 * prompts with their ids (or their template errors), in order.
 */
import { parentPort, workerData } from 'node:worker_threads';

import { errorMessage, loadTokenizer, type ChatTokenizer } from '../shared/index.js';
import { ENCODER_PROBE, packIds, type EncodeRequest, type EncoderReply, type EncoderThreadInit } from './prompt-encoder-messages.js';

async function main(): Promise<void> {
  const port = parentPort;
  if (port === null) throw new Error('prompt-encoder-thread.ts runs as a worker thread of prompt-encoder.ts');
  const init = workerData as EncoderThreadInit;
  const reply = (message: EncoderReply, transfer: ArrayBuffer[] = []): void => port.postMessage(message, transfer);
  let tokenizer: ChatTokenizer;
  try {
    tokenizer = await loadTokenizer(init.dir, {
      kind: init.kind,
      ...(init.pattern === undefined ? {} : { pattern: init.pattern }),
      ...(init.preset === undefined ? {} : { preset: init.preset }),
    });
  } catch (e: unknown) {
    reply({ type: 'failed', message: errorMessage(e) });
    return;
  }
  const [probe] = await tokenizer.encodePrompts([ENCODER_PROBE]);
  if (probe instanceof Error || probe === undefined || probe.join(',') !== init.probeIds.join(',')) {
    reply({ type: 'mismatch', detail: `the thread's tokenizer (${init.dir}) renders or encodes the probe conversation differently` });
    return;
  }
  port.on('message', (request: EncodeRequest) => {
    void tokenizer.encodePrompts(request.conversations).then(
      (results) => {
        const { packed, transfer } = packIds(results);
        reply({ type: 'result', id: request.id, packed }, transfer);
      },
      (e: unknown) => reply({ type: 'failed', message: errorMessage(e) }),
    );
  });
  reply({ type: 'ready' });
}

await main();
