import {
  GenerateBatchPayloadSchema,
  parsePayload,
  type GenerateBatchResult,
  type Logger,
} from '../../shared/index.js';
import type { SampleOutcome, SampleRequest } from './dispatcher.js';

/** What the generation processor needs from the outside world. */
export interface GenerateBatchDeps {
  /** For each sample id of the dataset: whether it is already committed. */
  isDone(dataset: string, ids: readonly string[]): Promise<boolean[]>;
  /** Attempts already spent per sample id (0 when none). */
  attemptsSpent(dataset: string, ids: readonly string[]): Promise<number[]>;
  /** Runs one sample to its end (commit, failure, skip or hand-back). */
  submit(req: SampleRequest): Promise<SampleOutcome>;
  logger: Logger;
}

export interface GenerateBatchOutcome extends GenerateBatchResult {
  /** Samples handed back by a stopping worker: the job must go back to the queue. */
  handedBack: number;
}

/**
 * Processes one batch of prompts: samples already committed are not sent again (DESIGN
 * invariant 6); the rest are handed to the dispatcher all at once, which keeps the endpoint
 * saturated across batch boundaries. One bad prompt fails alone: the batch still commits the others.
 */
export async function processGenerateBatch(data: unknown, deps: GenerateBatchDeps): Promise<GenerateBatchOutcome> {
  const payload = parsePayload(GenerateBatchPayloadSchema, data, 'generate batch');
  const { dataset, samples } = payload;
  const ids = samples.map((s) => s.id);
  const [done, spent] = await Promise.all([deps.isDone(dataset, ids), deps.attemptsSpent(dataset, ids)]);

  const result: GenerateBatchOutcome = {
    committed: 0,
    duplicates: 0,
    alreadyDone: 0,
    failed: 0,
    skippedByBudget: 0,
    outputTokens: 0,
    handedBack: 0,
  };
  const outcomes = await Promise.all(
    samples.map((sample, i) => {
      if (done[i] === true) return Promise.resolve<SampleOutcome | 'already-done'>('already-done');
      return deps.submit({
        dataset,
        sample,
        sampling: payload.sampling,
        maxAttempts: payload.maxAttempts,
        priorExpectedTokens: payload.priorExpectedTokens,
        attemptsSpent: spent[i] ?? 0,
      });
    }),
  );
  for (const o of outcomes) {
    if (o === 'already-done') {
      result.alreadyDone += 1;
      continue;
    }
    switch (o.kind) {
      case 'committed':
        result.committed += 1;
        result.outputTokens += o.completionTokens;
        break;
      case 'duplicate':
        result.duplicates += 1;
        break;
      case 'failed':
        result.failed += 1;
        break;
      case 'skipped-budget':
        result.skippedByBudget += 1;
        break;
      case 'handed-back':
        result.handedBack += 1;
        break;
    }
  }
  deps.logger.debug({ dataset, batchId: payload.batchId, ...result }, 'batch done');
  return result;
}
