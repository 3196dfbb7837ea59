/**
 * Speculative decoding as SGLang 0.5.23 runs it with `--speculative-algorithm EAGLE3
 * --speculative-eagle-topk 1`: after the prefill's token, a request decodes in verify steps.
 * Each step the drafter proposes `numSteps` tokens (`numDraftTokens - 1`), the target model
 * accepts a prefix of them and adds one token of its own (the bonus), so a step emits
 * accepted + 1 tokens. What is generated does not change (greedy verification): only how many
 * tokens each step emits, and so how long the request takes.
 *
 * Draft k (1-based) is accepted, given drafts < k were, with probability `acceptance[k - 1]`.
 * The draws are a pure function of (seed, rid). A step that would run past the completion's
 * end (its stop token or `max_new_tokens`) is cut there; as in SGLang, its accepted drafts are
 * still counted in `spec_num_correct_drafts`. So, for a request that ran to its end:
 *   completion_tokens = 1 + spec_num_correct_drafts + spec_verify_ct − cut,
 * where 1 is the prefill's token and cut (≥ 0, only the last step) is what the last step
 * accepted but did not emit. A request aborted while decoding ends on a step boundary (cut 0).
 *
 * `--speculative-algorithm DFLASH` (a block drafter, DFlash) is the same chain with other
 * numbers: each verify step the drafter fills a block of `blockSize` slots in one forward pass
 * (the first slot the last verified token, the others `blockSize - 1` drafts), the target
 * verifies the whole block, and draft k is accepted with a rate that decays with its position in
 * the block. A step costs 1 + draftOverhead + blockVerifyCost × blockSize decode steps.
 */
import { hashString, mulberry32, type Rng } from './random.js';

export const SPECULATIVE_ALGORITHMS = ['EAGLE3', 'DFLASH'] as const;
export type SpeculativeAlgorithm = (typeof SPECULATIVE_ALGORITHMS)[number];

/** How good the drafter is: per-position rates, or the accept length they should give. */
export interface AcceptanceSpec {
  /**
   * Per draft position k = 1..numSteps: the probability that draft k is accepted given that
   * drafts < k were (e.g. [0.8, 0.6, 0.4]); exactly `numSteps` entries in [0, 1] (DFLASH:
   * `blockSize - 1` entries, one per block position after the first).
   */
  acceptance?: number[];
  /**
   * The mean accept length to reach (tokens per verify step, bonus included), in
   * [1, numSteps + 1]: every position then gets the same rate p, 1 + p + … + p^numSteps = it.
   * DFLASH: in [1, blockSize], the decaying profile {@link dflashProfile} whose q reaches it.
   */
  meanAcceptLength?: number;
}

/** `speculative` of the simulator's options: SGLang's `--speculative-*` flags and the drafter. */
export interface SpeculativeOptions extends AcceptanceSpec {
  /** `--speculative-algorithm`: `EAGLE3` (the default) or `DFLASH` (block drafting). */
  algorithm?: SpeculativeAlgorithm;
  /** `--speculative-draft-model-path`, reported in /server_info. */
  draftModelPath: string;
  /** `--speculative-num-steps`: drafts per verify step; default 3 (EAGLE3 only). */
  numSteps?: number;
  /** `--speculative-eagle-topk`; default and only value 1 (a chain of drafts). */
  eagleTopk?: number;
  /**
   * `--speculative-num-draft-tokens`; default numSteps + 1. With topk 1 SGLang sets it to
   * numSteps + 1 whatever is given (with a warning), and so does the simulator.
   */
  numDraftTokens?: number;
  /**
   * Overrides of `acceptance` / `meanAcceptLength` by the dataset a request's rid names
   * ({@link datasetOfRid}); requests of other datasets use the top-level ones.
   */
  perDataset?: Record<string, AcceptanceSpec>;
  /**
   * What drafting and verifying one step costs beyond a plain decode step, as a share of it:
   * a verify step costs (1 + draftOverhead) decode steps. Default 0.25.
   */
  draftOverhead?: number;
  /** DFLASH: `--speculative-dflash-block-size`, slots per drafted block (the drafts are one fewer); default 16. */
  blockSize?: number;
  /**
   * DFLASH: what verifying one block slot costs, as a share of a plain decode step; a verify step
   * then costs 1 + draftOverhead + blockVerifyCost × blockSize. Default 0.02.
   */
  blockVerifyCost?: number;
}

/** {@link SpeculativeOptions} checked, with defaults applied. */
export interface ResolvedSpeculative {
  algorithm: SpeculativeAlgorithm;
  draftModelPath: string;
  numSteps: number;
  eagleTopk: number;
  numDraftTokens: number;
  /** The numDraftTokens given when it was not numSteps + 1 (and so was set to it). */
  numDraftTokensGiven: number | undefined;
  acceptance: readonly number[];
  perDataset: ReadonlyMap<string, readonly number[]>;
  /** What a verify step costs beyond a plain decode step (DFLASH: the block's verify cost included). */
  draftOverhead: number;
  /** DFLASH: slots per block (`numSteps` = blockSize − 1 drafts); undefined for EAGLE3. */
  blockSize: number | undefined;
  /** DFLASH: verify cost per block slot; undefined for EAGLE3. */
  blockVerifyCost: number | undefined;
}

export const DEFAULT_NUM_STEPS = 3;
export const DEFAULT_DRAFT_OVERHEAD = 0.25;
/** The per-position rate when neither `acceptance` nor `meanAcceptLength` is given. */
export const DEFAULT_ACCEPTANCE_RATE = 0.7;
export const DEFAULT_DFLASH_BLOCK_SIZE = 16;
/** DFLASH's drafter runs once per block: a smaller share than EAGLE3's chain of steps. */
export const DEFAULT_DFLASH_DRAFT_OVERHEAD = 0.1;
export const DEFAULT_BLOCK_VERIFY_COST = 0.02;
/** The q of DFLASH's default profile ({@link dflashProfile}): 0.85 at the first draft, 0.48 at the 15th. */
export const DEFAULT_DFLASH_Q = 0.85;

/**
 * DFLASH's acceptance per block position: draft k (1-based) accepted, given drafts < k were,
 * with probability q^(1 + (k − 1)/4): a profile that decays along the block, as a block
 * drafter's does (later slots are predicted from less context). q = 1 accepts every draft.
 */
export function dflashProfile(q: number, drafts: number): number[] {
  return Array.from({ length: drafts }, (_, i) => q ** (1 + i / 4));
}

/** The q for which {@link dflashProfile} reaches `meanAcceptLength` tokens per verify step. */
export function dflashRatesForMeanAcceptLength(meanAcceptLength: number, drafts: number): number[] {
  let low = 0;
  let high = 1;
  for (let i = 0; i < 60; i++) {
    const mid = (low + high) / 2;
    if (expectedAcceptLength(dflashProfile(mid, drafts)) < meanAcceptLength) low = mid;
    else high = mid;
  }
  return dflashProfile((low + high) / 2, drafts);
}

/** Expected tokens per verify step (bonus included) for per-position conditional rates. */
export function expectedAcceptLength(rates: readonly number[]): number {
  let length = 1;
  let reach = 1;
  for (const p of rates) {
    reach *= p;
    length += reach;
  }
  return length;
}

/** The one rate p, the same at every position, for which 1 + p + … + p^numSteps = meanAcceptLength. */
export function ratesForMeanAcceptLength(meanAcceptLength: number, numSteps: number): number[] {
  let low = 0;
  let high = 1;
  for (let i = 0; i < 60; i++) {
    const mid = (low + high) / 2;
    if (expectedAcceptLength(new Array<number>(numSteps).fill(mid)) < meanAcceptLength) low = mid;
    else high = mid;
  }
  return new Array<number>(numSteps).fill((low + high) / 2);
}

function resolveAcceptance(spec: AcceptanceSpec, numSteps: number, where: string, dflash = false): number[] {
  const { acceptance, meanAcceptLength } = spec;
  if (acceptance !== undefined && meanAcceptLength !== undefined) {
    throw new RangeError(`simulator option ${where}: give acceptance or meanAcceptLength, not both`);
  }
  if (acceptance !== undefined) {
    if (!Array.isArray(acceptance) || acceptance.length !== numSteps) {
      throw new RangeError(
        `simulator option ${where}.acceptance must have numSteps (${numSteps}) entries, got ${JSON.stringify(acceptance)}`,
      );
    }
    acceptance.forEach((p, i) => {
      if (typeof p !== 'number' || !(p >= 0 && p <= 1)) {
        throw new RangeError(`simulator option ${where}.acceptance[${i}] must be in [0, 1], got ${String(p)}`);
      }
    });
    return [...acceptance];
  }
  if (meanAcceptLength !== undefined) {
    if (typeof meanAcceptLength !== 'number' || !(meanAcceptLength >= 1 && meanAcceptLength <= numSteps + 1)) {
      throw new RangeError(
        `simulator option ${where}.meanAcceptLength must be in [1, numSteps + 1 = ${numSteps + 1}], got ${String(meanAcceptLength)}`,
      );
    }
    return dflash
      ? dflashRatesForMeanAcceptLength(meanAcceptLength, numSteps)
      : ratesForMeanAcceptLength(meanAcceptLength, numSteps);
  }
  return dflash ? dflashProfile(DEFAULT_DFLASH_Q, numSteps) : new Array<number>(numSteps).fill(DEFAULT_ACCEPTANCE_RATE);
}

/** Checks `speculative` and applies its defaults; RangeError naming the option when it is wrong. */
export function resolveSpeculative(o: SpeculativeOptions): ResolvedSpeculative {
  const algorithm = o.algorithm ?? 'EAGLE3';
  if (!SPECULATIVE_ALGORITHMS.includes(algorithm)) {
    throw new RangeError(
      `simulator option speculative.algorithm must be one of ${SPECULATIVE_ALGORITHMS.join(', ')}, got ${String(algorithm)}`,
    );
  }
  if (typeof o.draftModelPath !== 'string' || o.draftModelPath === '') {
    throw new RangeError('simulator option speculative.draftModelPath must be a non-empty string');
  }
  if (algorithm === 'DFLASH') return resolveDflash(o);
  if (o.blockSize !== undefined || o.blockVerifyCost !== undefined) {
    throw new RangeError('simulator option speculative.blockSize / blockVerifyCost: only with algorithm DFLASH');
  }
  const numSteps = o.numSteps ?? DEFAULT_NUM_STEPS;
  if (!Number.isInteger(numSteps) || numSteps < 1 || numSteps > 32) {
    throw new RangeError(
      `simulator option speculative.numSteps must be an integer in [1, 32], got ${String(numSteps)}`,
    );
  }
  const eagleTopk = o.eagleTopk ?? 1;
  if (eagleTopk !== 1) {
    throw new RangeError(
      `simulator option speculative.eagleTopk: only 1 (a chain of drafts) is simulated, got ${String(eagleTopk)}`,
    );
  }
  const given = o.numDraftTokens;
  if (given !== undefined && (!Number.isInteger(given) || given < 2)) {
    throw new RangeError(`simulator option speculative.numDraftTokens must be an integer ≥ 2, got ${String(given)}`);
  }
  const draftOverhead = o.draftOverhead ?? DEFAULT_DRAFT_OVERHEAD;
  if (typeof draftOverhead !== 'number' || !Number.isFinite(draftOverhead) || draftOverhead < 0) {
    throw new RangeError(`simulator option speculative.draftOverhead must be ≥ 0, got ${String(draftOverhead)}`);
  }
  const perDataset = new Map<string, readonly number[]>();
  for (const [name, spec] of Object.entries(o.perDataset ?? {})) {
    perDataset.set(name, resolveAcceptance(spec, numSteps, `speculative.perDataset.${name}`));
  }
  return {
    algorithm,
    draftModelPath: o.draftModelPath,
    numSteps,
    eagleTopk,
    numDraftTokens: numSteps + 1,
    numDraftTokensGiven: given !== undefined && given !== numSteps + 1 ? given : undefined,
    acceptance: resolveAcceptance(o, numSteps, 'speculative'),
    perDataset,
    draftOverhead,
    blockSize: undefined,
    blockVerifyCost: undefined,
  };
}

function nonNegative(name: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`simulator option speculative.${name} must be ≥ 0, got ${String(value)}`);
  }
  return value;
}

/** {@link resolveSpeculative} for DFLASH: a block of `blockSize` slots per verify step. */
function resolveDflash(o: SpeculativeOptions): ResolvedSpeculative {
  const blockSize = o.blockSize ?? DEFAULT_DFLASH_BLOCK_SIZE;
  if (!Number.isInteger(blockSize) || blockSize < 2 || blockSize > 64) {
    throw new RangeError(
      `simulator option speculative.blockSize must be an integer in [2, 64], got ${String(blockSize)}`,
    );
  }
  if (o.numSteps !== undefined) {
    throw new RangeError(
      'simulator option speculative.numSteps: DFLASH drafts a block in one pass; give speculative.blockSize instead',
    );
  }
  if (o.numDraftTokens !== undefined && o.numDraftTokens !== blockSize) {
    throw new RangeError(
      `simulator option speculative.numDraftTokens: DFLASH verifies the whole block, so it is blockSize (${blockSize}), got ${String(o.numDraftTokens)}`,
    );
  }
  const eagleTopk = o.eagleTopk ?? 1;
  if (eagleTopk !== 1) {
    throw new RangeError(`simulator option speculative.eagleTopk: DFLASH drafts a chain (1), got ${String(eagleTopk)}`);
  }
  const drafts = blockSize - 1;
  const overhead = nonNegative('draftOverhead', o.draftOverhead ?? DEFAULT_DFLASH_DRAFT_OVERHEAD);
  const blockVerifyCost = nonNegative('blockVerifyCost', o.blockVerifyCost ?? DEFAULT_BLOCK_VERIFY_COST);
  const perDataset = new Map<string, readonly number[]>();
  for (const [name, spec] of Object.entries(o.perDataset ?? {})) {
    perDataset.set(name, resolveAcceptance(spec, drafts, `speculative.perDataset.${name}`, true));
  }
  return {
    algorithm: 'DFLASH',
    draftModelPath: o.draftModelPath,
    numSteps: drafts,
    eagleTopk,
    numDraftTokens: blockSize,
    numDraftTokensGiven: undefined,
    acceptance: resolveAcceptance(o, drafts, 'speculative', true),
    perDataset,
    draftOverhead: overhead + blockVerifyCost * blockSize,
    blockSize,
    blockVerifyCost,
  };
}

/**
 * The dataset a request id names: `eval:<dataset>:<rest>` (tokenmill's evaluation) gives
 * `<dataset>`; `<dataset>/<sample>#<tag>` (tokenmill's generation stage) gives what is before
 * the first `/`. Any other rid names none.
 */
export function datasetOfRid(rid: string): string | undefined {
  const evalMatch = /^eval:([^:]+):/.exec(rid);
  if (evalMatch !== null) return evalMatch[1];
  const slash = rid.indexOf('/');
  return slash > 0 ? rid.slice(0, slash) : undefined;
}

/** The acceptance rates a request gets: its dataset's override, else the simulator's. */
export function acceptanceFor(spec: ResolvedSpeculative, rid: string): readonly number[] {
  const dataset = datasetOfRid(rid);
  return (dataset === undefined ? undefined : spec.perDataset.get(dataset)) ?? spec.acceptance;
}

/** One request's verify steps, decided before it decodes. */
export interface SpecPlan {
  /** Completion tokens, the prefill's token included. */
  outputTokens: number;
  /** Drafts accepted at each verify step (0..numSteps), the last step's in full. */
  accepted: readonly number[];
  /** `emittedBefore[i]`: tokens the first i steps emitted (length steps + 1; the last is outputTokens − 1). */
  emittedBefore: readonly number[];
}

/** The draws of one request: a pure function of (seed, rid). */
export function specRng(seed: number, rid: string): Rng {
  return mulberry32(hashString(`${seed}\u0000${rid}\u0000speculative`));
}

/** Splits a completion of `outputTokens` into the prefill's token and verify steps. */
export function planSpeculation(rates: readonly number[], outputTokens: number, rng: Rng): SpecPlan {
  const accepted: number[] = [];
  const emittedBefore: number[] = [0];
  let remaining = Math.max(0, outputTokens - 1);
  let emitted = 0;
  while (remaining > 0) {
    let a = 0;
    while (a < rates.length && rng() < (rates[a] ?? 0)) a++;
    const e = Math.min(a + 1, remaining);
    accepted.push(a);
    emitted += e;
    emittedBefore.push(emitted);
    remaining -= e;
  }
  return { outputTokens: Math.max(0, outputTokens), accepted, emittedBefore };
}

/**
 * What the request costs the load model, in plain decode steps: the prefill's token 1 (as it
 * costs without speculation), each verify step 1 + draftOverhead.
 */
export function specWork(plan: SpecPlan, draftOverhead: number): number {
  if (plan.outputTokens === 0) return 0;
  return 1 + plan.accepted.length * (1 + draftOverhead);
}

/** Tokens emitted once `work` decode steps of the request are done: they come a step at a time. */
export function tokensAfterWork(plan: SpecPlan, draftOverhead: number, work: number): number {
  if (plan.outputTokens === 0 || work < 1 - 1e-9) return 0;
  const steps = Math.min(plan.accepted.length, Math.floor((work - 1) / (1 + draftOverhead) + 1e-9));
  return 1 + (plan.emittedBefore[steps] ?? 0);
}

/** SGLang's per-request counters after `tokens` completion tokens. */
export interface SpecCounts {
  verifyCt: number;
  correctDrafts: number;
  /** Entry k: verify steps that accepted exactly k drafts (as `update_spec_correct_drafts_histogram`). */
  histogram: number[];
}

/** The counters once `tokens` completion tokens are out: the steps whose tokens all are. */
export function specCounts(plan: SpecPlan, tokens: number): SpecCounts {
  // The largest k with 1 + emittedBefore[k] ≤ tokens.
  let low = 0;
  let high = plan.accepted.length;
  if (tokens < 1) high = 0;
  while (low < high) {
    const mid = Math.ceil((low + high) / 2);
    if (1 + (plan.emittedBefore[mid] ?? Infinity) <= tokens) low = mid;
    else high = mid - 1;
  }
  const histogram: number[] = [];
  let correctDrafts = 0;
  for (let i = 0; i < low; i++) {
    const a = plan.accepted[i] ?? 0;
    correctDrafts += a;
    while (histogram.length <= a) histogram.push(0);
    histogram[a] = (histogram[a] ?? 0) + 1;
  }
  return { verifyCt: low, correctDrafts, histogram };
}

/**
 * The `meta_info` fields of a finished request (`TokenizerManager._calculate_spec_decoding_metrics`),
 * or undefined without a verify step (SGLang then adds none).
 */
export function specMetaInfo(
  counts: SpecCounts,
  numDraftTokens: number,
  completionTokens: number,
): Record<string, unknown> | undefined {
  if (counts.verifyCt <= 0) return undefined;
  const proposed = counts.verifyCt * (numDraftTokens - 1);
  return {
    spec_accept_rate: counts.correctDrafts / proposed,
    spec_accept_length: completionTokens / counts.verifyCt,
    spec_num_correct_drafts: counts.correctDrafts,
    spec_num_proposed_drafts: proposed,
    spec_verify_ct: counts.verifyCt,
    spec_correct_drafts_histogram: counts.histogram,
  };
}

/** One simulator's speculative decoding: plans per request, and the totals behind /server_info. */
export class Speculation {
  /** Tokens emitted by verify steps and verify steps, over requests ended (avg_spec_accept_length). */
  private acceptTokens = 0;
  private forwardCt = 0;

  constructor(
    readonly spec: ResolvedSpeculative,
    private readonly seed: number,
  ) {}

  plan(rid: string, outputTokens: number): SpecPlan {
    return planSpeculation(acceptanceFor(this.spec, rid), outputTokens, specRng(this.seed, rid));
  }

  /** What the load model needs of a speculative request. */
  loadJob(plan: SpecPlan): { decodeWork: number; tokensAfterWork: (work: number) => number } {
    const overhead = this.spec.draftOverhead;
    return { decodeWork: specWork(plan, overhead), tokensAfterWork: (work) => tokensAfterWork(plan, overhead, work) };
  }

  /** The `meta_info` fields of a request that ended with `completionTokens` out. */
  metaInfo(plan: SpecPlan, completionTokens: number): Record<string, unknown> | undefined {
    return specMetaInfo(specCounts(plan, completionTokens), this.spec.numDraftTokens, completionTokens);
  }

  /** Counts a request that ended with `completionTokens` out in the totals (once per request). */
  record(plan: SpecPlan, completionTokens: number): void {
    const counts = specCounts(plan, completionTokens);
    if (counts.verifyCt === 0) return;
    this.forwardCt += counts.verifyCt;
    this.acceptTokens += completionTokens - 1;
  }

  /** Mean tokens per verify step so far, as the scheduler's `avg_spec_accept_length`; undefined before any. */
  averageAcceptLength(): number | undefined {
    return this.forwardCt > 0 ? this.acceptTokens / this.forwardCt : undefined;
  }
}

/**
 * Parses a command-line acceptance value: rates separated by commas (`0.8,0.6,0.4`), or one
 * number: ≥ 1 a mean accept length (`2.4`), below 1 the rate of a single step (`0.7`).
 * Throws RangeError on anything else.
 */
export function parseAcceptanceArg(value: string): AcceptanceSpec {
  const parts = value.split(',').map((p) => p.trim());
  const numbers = parts.map(Number);
  if (parts.some((p) => p === '') || numbers.some((n) => !Number.isFinite(n))) {
    throw new RangeError(`expected a mean accept length (2.4) or per-position rates (0.8,0.6,0.4), got "${value}"`);
  }
  const [only] = numbers;
  if (numbers.length === 1 && only !== undefined && only >= 1) return { meanAcceptLength: only };
  return { acceptance: numbers };
}

/** The `speculative_*` keys of /server_info (SGLang's server args): null without speculation. */
export function speculativeServerInfo(spec: ResolvedSpeculative | undefined): Record<string, unknown> {
  const dflash = spec?.algorithm === 'DFLASH';
  return {
    speculative_algorithm: spec?.algorithm ?? null,
    speculative_draft_model_path: spec?.draftModelPath ?? null,
    // DFLASH drafts the whole block in one drafter pass: one step, the block's slots verified.
    speculative_num_steps: dflash ? 1 : (spec?.numSteps ?? null),
    speculative_eagle_topk: spec?.eagleTopk ?? null,
    speculative_num_draft_tokens: spec?.numDraftTokens ?? null,
    speculative_dflash_block_size: spec?.blockSize ?? null,
  };
}

/** SGLang's `--speculative-*` arguments that start such a server, for `launch_command`. */
export function speculativeLaunchArgs(spec: ResolvedSpeculative | undefined): string[] {
  if (spec === undefined) return [];
  if (spec.algorithm === 'DFLASH')
    return [
      '--speculative-algorithm',
      'DFLASH',
      '--speculative-draft-model-path',
      spec.draftModelPath,
      '--speculative-dflash-block-size',
      String(spec.blockSize ?? DEFAULT_DFLASH_BLOCK_SIZE),
    ];
  return [
    '--speculative-algorithm',
    spec.algorithm,
    '--speculative-draft-model-path',
    spec.draftModelPath,
    '--speculative-num-steps',
    String(spec.numSteps),
    '--speculative-eagle-topk',
    String(spec.eagleTopk),
    '--speculative-num-draft-tokens',
    String(spec.numDraftTokens),
  ];
}

/** The `tokenmill sim --speculative-*` flags, as commander hands them over. */
export interface SpeculativeFlags {
  speculativeAlgorithm?: string | undefined;
  speculativeDraftModelPath?: string | undefined;
  speculativeNumSteps?: number | undefined;
  speculativeEagleTopk?: number | undefined;
  speculativeNumDraftTokens?: number | undefined;
  speculativeAcceptance?: string | undefined;
  /** `<dataset>=<acceptance>`, repeated. */
  speculativeDataset?: string[] | undefined;
  speculativeDraftOverhead?: number | undefined;
  speculativeDflashBlockSize?: number | undefined;
  speculativeBlockVerifyCost?: number | undefined;
}

/**
 * `speculative` from the command line: undefined without `--speculative-algorithm`. RangeError
 * (naming the flag) when a flag is wrong or given without the algorithm.
 */
export function speculativeFromFlags(f: SpeculativeFlags): SpeculativeOptions | undefined {
  if (f.speculativeAlgorithm === undefined) {
    const stray = Object.entries(f).find(([, v]) => v !== undefined);
    if (stray !== undefined) {
      const flag = stray[0].replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
      throw new RangeError(`--${flag} needs --speculative-algorithm EAGLE3 or DFLASH`);
    }
    return undefined;
  }
  if (f.speculativeDraftModelPath === undefined) {
    throw new RangeError('--speculative-algorithm needs --speculative-draft-model-path');
  }
  const perDataset: Record<string, AcceptanceSpec> = {};
  for (const entry of f.speculativeDataset ?? []) {
    const eq = entry.indexOf('=');
    if (eq <= 0) throw new RangeError(`--speculative-dataset expects <dataset>=<acceptance>, got "${entry}"`);
    perDataset[entry.slice(0, eq)] = parseAcceptanceArg(entry.slice(eq + 1));
  }
  return {
    algorithm: f.speculativeAlgorithm as SpeculativeAlgorithm,
    draftModelPath: f.speculativeDraftModelPath,
    ...(f.speculativeNumSteps === undefined ? {} : { numSteps: f.speculativeNumSteps }),
    ...(f.speculativeEagleTopk === undefined ? {} : { eagleTopk: f.speculativeEagleTopk }),
    ...(f.speculativeNumDraftTokens === undefined ? {} : { numDraftTokens: f.speculativeNumDraftTokens }),
    ...(f.speculativeAcceptance === undefined ? {} : parseAcceptanceArg(f.speculativeAcceptance)),
    ...(Object.keys(perDataset).length === 0 ? {} : { perDataset }),
    ...(f.speculativeDraftOverhead === undefined ? {} : { draftOverhead: f.speculativeDraftOverhead }),
    ...(f.speculativeDflashBlockSize === undefined ? {} : { blockSize: f.speculativeDflashBlockSize }),
    ...(f.speculativeBlockVerifyCost === undefined ? {} : { blockVerifyCost: f.speculativeBlockVerifyCost }),
  };
}
