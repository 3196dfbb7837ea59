/**
 * What one evaluation phase measured, summed over its answers, and the figures derived from the
 * sums. Every ratio is a ratio of sums (token-weighted), never a mean of per-request ratios: a
 * 2-token answer that accepted everything must not weigh as much as a 500-token one.
 */
import { isRecord } from '../../shared/index.js';

/** The speculative-decoding fields of one `/generate` answer's `meta_info` (SGLang 0.5.23). */
export interface SpecAnswerStats {
  /** `spec_verify_ct`: verify steps (forward passes of the target) the request took. */
  verifySteps: number;
  /** `spec_num_correct_drafts`: drafted tokens the target accepted, when reported. */
  correctDrafts: number | undefined;
  /** `spec_num_proposed_drafts`: drafted tokens proposed, when reported. */
  proposedDrafts: number | undefined;
  /** `spec_correct_drafts_histogram`: entry k = verify steps that accepted k drafts, when reported. */
  histogram: number[] | undefined;
}

const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/**
 * The speculative fields of a `meta_info`, or undefined when it has no `spec_verify_ct` (the
 * server did not decode speculatively). A field present but malformed is a string saying which.
 */
export function specStatsOf(meta: unknown): SpecAnswerStats | string | undefined {
  if (!isRecord(meta) || meta.spec_verify_ct === undefined || meta.spec_verify_ct === null) return undefined;
  if (!isCount(meta.spec_verify_ct))
    return `meta_info.spec_verify_ct: expected an integer >= 0, got ${JSON.stringify(meta.spec_verify_ct)}`;
  const optionalCount = (key: string): number | undefined | string => {
    const v = meta[key];
    if (v === undefined || v === null) return undefined;
    return isCount(v) ? v : `meta_info.${key}: expected an integer >= 0, got ${JSON.stringify(v)}`;
  };
  const correct = optionalCount('spec_num_correct_drafts');
  if (typeof correct === 'string') return correct;
  const proposed = optionalCount('spec_num_proposed_drafts');
  if (typeof proposed === 'string') return proposed;
  const h = meta.spec_correct_drafts_histogram;
  let histogram: number[] | undefined;
  if (h !== undefined && h !== null) {
    if (!Array.isArray(h) || !h.every(isCount))
      return `meta_info.spec_correct_drafts_histogram: expected a list of integers >= 0, got ${JSON.stringify(h).slice(0, 80)}`;
    histogram = h;
  }
  return { verifySteps: meta.spec_verify_ct, correctDrafts: correct, proposedDrafts: proposed, histogram };
}

/** Sums over the answers of one phase (one dataset, drafter or baseline). */
export interface PhaseTotals {
  /** Requests sent (answered or failed). */
  requests: number;
  /** Requests that got no usable answer (timeout, server error). */
  failures: number;
  promptTokens: number;
  completionTokens: number;
  /** Σ `spec_verify_ct` (drafter phases). */
  verifySteps: number;
  /** Σ `spec_num_correct_drafts`, over the answers that reported it. */
  correctDrafts: number;
  /** Σ `spec_num_proposed_drafts`, over the answers that reported it. */
  proposedDrafts: number;
  /** Answers that reported both draft counts (the acceptance rate is theirs). */
  draftCountAnswers: number;
  /** Σ of the answers' histograms, entry by entry. */
  histogram: number[];
  /** Σ SGLang's `e2e_latency` (seconds), over the answers that reported it. */
  e2eLatencySec: number;
  e2eLatencyAnswers: number;
  /** Wall time of the phase, first request sent to last answer (seconds). */
  wallSec: number;
}

/** Totals with nothing counted yet. */
export function emptyTotals(): PhaseTotals {
  return {
    requests: 0,
    failures: 0,
    promptTokens: 0,
    completionTokens: 0,
    verifySteps: 0,
    correctDrafts: 0,
    proposedDrafts: 0,
    draftCountAnswers: 0,
    histogram: [],
    e2eLatencySec: 0,
    e2eLatencyAnswers: 0,
    wallSec: 0,
  };
}

/** One answer as the totals need it. */
export interface AnswerStats {
  promptTokens: number;
  completionTokens: number;
  e2eLatencySec?: number | undefined;
  spec?: SpecAnswerStats | undefined;
}

/** Adds one answer to `t` (in place). */
export function addAnswer(t: PhaseTotals, a: AnswerStats): void {
  t.requests += 1;
  t.promptTokens += a.promptTokens;
  t.completionTokens += a.completionTokens;
  if (a.e2eLatencySec !== undefined) {
    t.e2eLatencySec += a.e2eLatencySec;
    t.e2eLatencyAnswers += 1;
  }
  const s = a.spec;
  if (s === undefined) return;
  t.verifySteps += s.verifySteps;
  if (s.correctDrafts !== undefined && s.proposedDrafts !== undefined) {
    t.correctDrafts += s.correctDrafts;
    t.proposedDrafts += s.proposedDrafts;
    t.draftCountAnswers += 1;
  }
  if (s.histogram !== undefined) addHistogram(t.histogram, s.histogram);
}

/** Adds a failed request to `t` (in place). */
export function addFailure(t: PhaseTotals): void {
  t.requests += 1;
  t.failures += 1;
}

/** `into[k] += h[k]` for every k, growing `into` as needed. */
export function addHistogram(into: number[], h: readonly number[]): void {
  for (let k = 0; k < h.length; k++) into[k] = (into[k] ?? 0) + (h[k] ?? 0);
}

/** The sum of several totals (datasets into the overall figures); wall times add up, phases ran one after another. */
export function sumTotals(list: readonly PhaseTotals[]): PhaseTotals {
  const t = emptyTotals();
  for (const x of list) {
    t.requests += x.requests;
    t.failures += x.failures;
    t.promptTokens += x.promptTokens;
    t.completionTokens += x.completionTokens;
    t.verifySteps += x.verifySteps;
    t.correctDrafts += x.correctDrafts;
    t.proposedDrafts += x.proposedDrafts;
    t.draftCountAnswers += x.draftCountAnswers;
    addHistogram(t.histogram, x.histogram);
    t.e2eLatencySec += x.e2eLatencySec;
    t.e2eLatencyAnswers += x.e2eLatencyAnswers;
    t.wallSec += x.wallSec;
  }
  return t;
}

/** A phase's figures, as the report and `eval.json` give them. */
export interface PhaseStats {
  requests: number;
  failures: number;
  promptTokens: number;
  completionTokens: number;
  wallSec: number;
  /** Σ completion tokens / wall time: output tokens per second at the phase's concurrency. */
  tokensPerSec: number | null;
  /** Σ e2e latency / answers that reported one (seconds). */
  meanE2eLatencySec: number | null;
  /** Drafter phases: Σ verify steps. */
  verifySteps?: number;
  /** Drafter phases: Σ completion tokens / Σ verify steps (the bonus token included, as SGLang counts it). */
  acceptLength?: number | null;
  /** Drafter phases: Σ correct drafts / Σ proposed drafts, null when no answer reported them. */
  acceptRate?: number | null;
  correctDrafts?: number;
  proposedDrafts?: number;
  /** Drafter phases: entry k = verify steps that accepted k drafts, summed over the answers. */
  histogram?: number[];
}

const ratio = (a: number, b: number): number | null => (b > 0 ? a / b : null);

/** The figures of `t`; `speculative` adds the acceptance figures (drafter phases). */
export function phaseStats(t: PhaseTotals, speculative: boolean): PhaseStats {
  const out: PhaseStats = {
    requests: t.requests,
    failures: t.failures,
    promptTokens: t.promptTokens,
    completionTokens: t.completionTokens,
    wallSec: t.wallSec,
    tokensPerSec: ratio(t.completionTokens, t.wallSec),
    meanE2eLatencySec: ratio(t.e2eLatencySec, t.e2eLatencyAnswers),
  };
  if (!speculative) return out;
  return {
    ...out,
    verifySteps: t.verifySteps,
    acceptLength: ratio(t.completionTokens, t.verifySteps),
    acceptRate: t.draftCountAnswers > 0 ? ratio(t.correctDrafts, t.proposedDrafts) : null,
    correctDrafts: t.correctDrafts,
    proposedDrafts: t.proposedDrafts,
    histogram: [...t.histogram],
  };
}

/** Drafter tokens/s over baseline tokens/s, or null when either is unknown. */
export function speedupOf(drafter: PhaseStats, baseline: PhaseStats | null): number | null {
  if (baseline === null || drafter.tokensPerSec === null || baseline.tokensPerSec === null) return null;
  return baseline.tokensPerSec > 0 ? drafter.tokensPerSec / baseline.tokensPerSec : null;
}
