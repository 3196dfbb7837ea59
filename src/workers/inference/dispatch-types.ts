import type { Sample } from '../../shared/index.js';

/** What became of one sample handed to the dispatcher. */
export type SampleOutcome =
  | { kind: 'committed'; completionTokens: number; outputIds?: readonly number[]; endpoint?: string }
  | { kind: 'duplicate' }
  | { kind: 'failed'; reason: string; status?: number | undefined; attempts?: number }
  | { kind: 'skipped-budget' }
  | { kind: 'handed-back' };

export interface SampleRequest {
  dataset: string;
  sample: Sample;
  sampling: Record<string, unknown>;
  maxAttempts: number;
  priorExpectedTokens: number;
  /** The producer's vocabulary size: an answer with an output id at or above it is refused (an attempt). */
  vocabSize?: number;
  /** Attempts already spent on this sample (from Redis), so the record says which attempt won. */
  attemptsSpent: number;
  /** The batch job (its lock token) this sample came with; lets a lost batch be withdrawn. */
  owner?: string;
  /** The id of the batch job, written into a failure record (Bull Board's Retry of that job claims it). */
  jobId?: string;
  /** A turn of a conversation regenerated turn by turn: written into its record (and its history). */
  conversation?: {
    id: string;
    turn: number;
    turns: number;
    spliced: boolean;
    /** `[start, length]` of each earlier turn's output in the prompt ids, while every turn was spliced. */
    historyOutputs?: [number, number][];
    /** The tool results this turn's history placed after the previous turn's calls, and where they came from. */
    toolResults?: { origin: 'source' | 'executor'; messages: readonly unknown[] };
  };
  /** The endpoint to ask first while it has a free slot (a conversation's next turn: its prefix is cached there). */
  preferEndpoint?: string;
  /** Told when an attempt fails and the sample will be sent again (for the job's log). */
  onAttemptFailed?: (attempt: number, message: string) => void;
}
