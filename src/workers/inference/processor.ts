import {
  EnvironmentError,
  GenerateBatchPayloadSchema,
  batchSamples,
  parsePayload,
  type BatchProgress,
  type GenerateBatchPayload,
  type GenerateBatchResult,
  type Logger,
  type Sample,
} from '../../shared/index.js';
import type { SampleOutcome, SampleRequest } from './dispatcher.js';
import { driveConversation, type ConversationDeps } from './conversation-driver.js';
import type { FailureRecord } from './failure-records.js';

/** What the generation processor needs from the outside world. */
export interface GenerateBatchDeps {
  /** For each sample id of the dataset: whether it is already committed. */
  isDone(dataset: string, ids: readonly string[]): Promise<boolean[]>;
  /** Attempts already spent per sample id (0 when none). */
  attemptsSpent(dataset: string, ids: readonly string[]): Promise<number[]>;
  /** The failure record of each sample id, if it has one. */
  failures(dataset: string, ids: readonly string[]): Promise<(FailureRecord | undefined)[]>;
  /** Claims failed samples for this (retried) job: one claim-failed-3.lua code per id. */
  claimFailed(dataset: string, ids: readonly string[]): Promise<number[]>;
  /** Drops this job's claims of samples that ended skipped (release-claims-1.lua). */
  releaseClaims(dataset: string, ids: readonly string[]): Promise<void>;
  /** Runs one sample to its end (commit, failure, skip or hand-back). */
  submit(req: SampleRequest): Promise<SampleOutcome>;
  /** A conversation ended before its last turn (see {@link ConversationDeps.ended}). */
  conversationEnded?(dataset: string, conversationId: string): void;
  /**
   * For batches of conversations regenerated turn by turn (`turns: all`): the tokenizer, the
   * history and the finished conversations. A worker without it refuses such a batch.
   */
  conversations?: Omit<ConversationDeps, 'submit' | 'isDone'> & {
    /** For each conversation id: whether it has finished (complete or ended). */
    finished(dataset: string, ids: readonly string[]): Promise<boolean[]>;
  };
  /** The batch job's id: failure records name it, and only its retry claims them. */
  jobId?: string;
  /** Whether this delivery still holds the batch (see {@link ConversationDeps.stillHeld}). */
  stillHeld?(): Promise<boolean>;
  /** Told as samples settle (the caller throttles it). */
  progress?(p: BatchProgress): void;
  /** A line for the job's log: one per failed or retried prompt. */
  log?(line: string): void;
  logger: Logger;
}

/** A prompt that ended failed in this job, with its failure record. */
export interface BatchFailure {
  sample: Sample;
  record: FailureRecord;
}

export interface GenerateBatchOutcome extends GenerateBatchResult {
  /** Samples handed back by a stopping worker: the job must go back to the queue. */
  handedBack: number;
  /** Failed prompts whose record still names this job: the job ends failed, carrying them. */
  failures: BatchFailure[];
  /** The parsed payload (the job's data is rebuilt from it when the job fails). */
  payload: GenerateBatchPayload;
  samples: Sample[];
}

const who = (s: Sample): string => `line ${s.line} (id ${s.id})`;

/**
 * Processes one batch of prompts: samples already committed are not sent again (docs/design.md,
 * invariant 6); the rest are handed to the dispatcher all at once, which keeps the endpoint
 * saturated across batch boundaries. One bad prompt fails alone: the batch still commits the
 * others, and its failed prompts are returned so the job can end failed, carrying only them.
 *
 * A job that ended failed and was retried (`retryOfFailed`) claims its prompts' failure
 * records first (claim-failed-3.lua) and sends only those it claimed, with fresh attempts; a
 * prompt committed or given back another way meanwhile is not sent again. A first delivery
 * never re-sends a prompt that has a failure record: its attempts are spent.
 */
export async function processGenerateBatch(data: unknown, deps: GenerateBatchDeps): Promise<GenerateBatchOutcome> {
  const payload = parsePayload(GenerateBatchPayloadSchema, data, 'generate batch');
  const { dataset } = payload;
  const samples = batchSamples(payload);
  const ids = samples.map((s) => s.id);
  const retry = payload.retryOfFailed === true && deps.jobId !== undefined;
  const conversations = payload.turns === 'all' ? deps.conversations : undefined;
  if (payload.turns === 'all' && conversations === undefined)
    throw new EnvironmentError(
      `batch ${payload.batchId} holds conversations regenerated turn by turn (turns: all), and this worker has no tokenizer to render their turns: start it with the run's config`,
    );
  // One round trip for a first delivery; a retry reads attempts after its claim resets them.
  const [done, records, spentAll] = await Promise.all([
    conversations === undefined ? deps.isDone(dataset, ids) : conversations.finished(dataset, ids),
    retry ? Promise.resolve([]) : deps.failures(dataset, ids),
    retry ? Promise.resolve([]) : deps.attemptsSpent(dataset, ids),
  ]);
  const result: GenerateBatchOutcome = {
    committed: 0,
    duplicates: 0,
    alreadyDone: 0,
    failed: 0,
    skippedByBudget: 0,
    outputTokens: 0,
    handedBack: 0,
    failures: [],
    payload,
    samples,
  };
  let notResent = 0;
  const progress = (): void =>
    deps.progress?.({
      committed: result.committed + result.duplicates + result.alreadyDone,
      failed: result.failed,
      skipped: result.skippedByBudget + notResent,
      size: samples.length,
    });

  // Which samples to send: not committed, and either claimed (a retried failed job) or without a failure record.
  const send = new Array<boolean>(samples.length).fill(false);
  const open = samples.map((_, i) => i).filter((i) => done[i] !== true);
  result.alreadyDone = samples.length - open.length;
  const openIds = open.map((i) => ids[i] ?? '');
  if (retry) {
    const codes = openIds.length === 0 ? [] : await deps.claimFailed(dataset, openIds);
    open.forEach((i, k) => {
      const s = samples[i];
      if (s === undefined) return;
      const code = codes[k];
      if (code === 1) {
        send[i] = true;
        deps.log?.(`${who(s)}: sent again with fresh attempts (retry of a failed prompt)`);
      } else if (code === 0) {
        result.alreadyDone += 1;
      } else {
        notResent += 1;
        deps.log?.(
          `${who(s)}: not sent again: ${code === -1 ? 'no failure recorded any more (retried another way, or skipped)' : 'its failure belongs to another job'}`,
        );
      }
    });
  } else {
    for (const i of open) {
      if (records[i] === undefined) send[i] = true;
      else result.failed += 1; // failed in an earlier delivery of this job: its attempts are spent
    }
  }
  progress();

  const sendIdx = samples.map((_, i) => i).filter((i) => send[i]);
  const spent = !retry
    ? sendIdx.map((i) => spentAll[i] ?? 0)
    : sendIdx.length === 0
      ? []
      : await deps.attemptsSpent(
          dataset,
          sendIdx.map((i) => ids[i] ?? ''),
        );
  const outcomes = await Promise.all(
    sendIdx.map(async (i, k) => {
      const sample = samples[i] as Sample;
      const base = {
        dataset,
        sampling: sample.sampling === undefined ? payload.sampling : { ...payload.sampling, ...sample.sampling },
        maxAttempts: payload.maxAttempts,
        priorExpectedTokens: payload.priorExpectedTokens,
        ...(payload.vocabSize === undefined ? {} : { vocabSize: payload.vocabSize }),
        ...(deps.jobId === undefined ? {} : { jobId: deps.jobId }),
        onAttemptFailed: (attempt: number, message: string) =>
          deps.log?.(`${who(sample)}: attempt ${attempt} of ${payload.maxAttempts} failed, will retry: ${message}`),
      };
      const o =
        conversations === undefined
          ? await deps.submit({ ...base, sample, attemptsSpent: spent[k] ?? 0 })
          : await conversationOutcome(
              sample,
              base,
              payload,
              {
                ...conversations,
                isDone: deps.isDone,
                submit: deps.submit,
                ...(deps.stillHeld === undefined ? {} : { stillHeld: deps.stillHeld }),
                ...(deps.conversationEnded === undefined ? {} : { ended: deps.conversationEnded }),
              },
              deps,
            );
      count(result, o);
      if (o.kind === 'failed')
        deps.log?.(
          `${who(sample)}: failed${o.status === undefined ? '' : ` (HTTP ${o.status})`}${o.attempts === undefined ? '' : ` after ${o.attempts} attempt(s)`}: ${o.reason}`,
        );
      progress();
      return { sample, o };
    }),
  );

  if (retry) {
    const skipped = outcomes.filter((x) => x.o.kind === 'skipped-budget').map((x) => x.sample.id);
    if (skipped.length > 0) await deps.releaseClaims(dataset, skipped);
  }
  if (result.failed > 0 && result.handedBack === 0 && deps.jobId !== undefined) {
    // The failed prompts whose record still names this job (retry-failed may have given some
    // back to the producer meanwhile): the job ends failed, carrying exactly these.
    const records = await deps.failures(dataset, ids);
    samples.forEach((sample, i) => {
      const record = records[i];
      if (record !== undefined && record.job === deps.jobId && record.retrying !== true)
        result.failures.push({ sample, record });
    });
  }
  deps.logger.debug(
    {
      dataset,
      batchId: payload.batchId,
      committed: result.committed,
      failed: result.failed,
      skipped: result.skippedByBudget,
      handedBack: result.handedBack,
    },
    'batch done',
  );
  return result;
}

/** One conversation driven to its end (or pause), as the batch counts it: a finished conversation counts as committed. */
async function conversationOutcome(
  sample: Sample,
  base: Parameters<typeof driveConversation>[1],
  payload: GenerateBatchPayload,
  deps: ConversationDeps,
  batch: GenerateBatchDeps,
): Promise<SampleOutcome> {
  const o = await driveConversation(
    sample,
    base,
    {
      maxNewTokens: sample.maxNewTokens,
      ...(payload.templateKwargs === undefined ? {} : { templateKwargs: payload.templateKwargs }),
      ...(payload.contextLength === undefined ? {} : { contextLength: payload.contextLength }),
      ...(payload.minNewTokens === undefined ? {} : { minNewTokens: payload.minNewTokens }),
      ...(payload.toolCallFormat === undefined
        ? {}
        : { tools: { format: payload.toolCallFormat, tools: sample.tools, executor: payload.toolExecutor } }),
    },
    deps,
  );
  switch (o.kind) {
    case 'finished':
      if (o.end.kind === 'ended')
        batch.log?.(
          `${who(sample)}: conversation ended after ${o.end.turnsDone} of ${o.end.turns} turns: ${o.end.reason ?? ''}`,
        );
      return { kind: 'committed', completionTokens: o.outputTokens };
    case 'skipped-budget':
      return { kind: 'skipped-budget' };
    case 'handed-back':
      return { kind: 'handed-back' };
    case 'finished-elsewhere':
      return { kind: 'duplicate' };
  }
}

function count(result: GenerateBatchOutcome, o: SampleOutcome): void {
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
