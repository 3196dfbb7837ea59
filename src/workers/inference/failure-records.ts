import type { Sample } from '../../shared/index.js';

/** A failure record as the dataset's failed hash holds it (JSON written by `recordFailure`). */
export interface FailureRecord {
  reason: string;
  /** SGLang's HTTP status, when it answered one. */
  status?: number;
  attempts?: number;
  endpoint?: string;
  line?: number;
  /** The batch job the prompt failed in: only a retry of that job claims it again. */
  job?: string;
  /** Claimed by a retry of its job, which is sending it again (claim-failed-3.lua). */
  retrying?: boolean;
  ts?: string;
}

/** Parses a failure record; a value that is not one becomes a record with the raw text as its reason. */
export function parseFailureRecord(raw: string | null | undefined): FailureRecord | undefined {
  if (raw === null || raw === undefined) return undefined;
  try {
    const v: unknown = JSON.parse(raw);
    if (typeof v === 'object' && v !== null && typeof (v as { reason?: unknown }).reason === 'string')
      return v as FailureRecord;
  } catch {
    // not JSON: fall through
  }
  return { reason: raw };
}

/** One failed prompt in one line: `line 1205 (id abc): HTTP 500, 3 attempts: <reason>`. */
export function describeFailure(sample: Pick<Sample, 'id' | 'line'>, record: FailureRecord): string {
  const facts = [
    record.status === undefined ? undefined : `HTTP ${record.status}`,
    record.attempts === undefined ? undefined : `${record.attempts} attempt(s)`,
  ].filter((x) => x !== undefined);
  return `line ${sample.line} (id ${sample.id})${facts.length === 0 ? '' : `, ${facts.join(', ')}`}: ${record.reason}`;
}

/** Failed prompts listed in full in a failed job's reason; the rest are counted (the job's log has each). */
const LISTED = 10;

/** A failed batch job's `failedReason`: how many failed, then each (up to ten), most useful first. */
export function failedJobReason(
  jobName: string,
  size: number,
  failures: readonly { sample: Pick<Sample, 'id' | 'line'>; record: FailureRecord }[],
): string {
  const head = `${failures.length} of ${size} prompt(s) failed in ${jobName}; Retry sends them again with fresh attempts`;
  const listed = failures.slice(0, LISTED).map((f) => `- ${describeFailure(f.sample, f.record)}`);
  const more = failures.length > LISTED ? [`- … and ${failures.length - LISTED} more (see the job's log)`] : [];
  return [head, ...listed, ...more].join('\n');
}
