import { mulberry32, type Rng } from './random.js';

/** Shapes of a bad answer the simulator can give instead of a generation (`badAnswer`). */
export const BAD_ANSWERS = [
  'html502',
  'wrong-shape',
  'no-output-ids',
  'negative-count',
  'out-of-vocab',
  'truncated',
  '413',
] as const;
export type BadAnswer = (typeof BAD_ANSWERS)[number];

/** Faults the simulator injects into generation requests (and health checks). */
export interface FaultConfig {
  /** Fraction of /generate and chat requests answered 500 with SGLang's error body. */
  errorRate: number;
  /** The next N generation requests get 503 (counts down). */
  burst503: number;
  /** Fraction that never answer, until the client disconnects or the request is aborted. */
  hangRate: number;
  /** Fraction whose socket is destroyed without a response. */
  dropRate: number;
  /** Fraction answered 200 with a truncated JSON body. */
  malformedRate: number;
  /** /health and /health_generate answer 503 (generation itself still works). */
  unhealthy: boolean;
  /**
   * Fraction of sample ids (the rid's part before `#`, decided by a seeded hash, so the same
   * ids every run) whose first request is answered 503 "The request queue is full."; later
   * requests for the same sample id are served.
   */
  firstTry503Rate: number;
  /**
   * Sample ids (`<dataset>/<id>`, or just `<id>`) that crash the server: the connection is
   * dropped and the server is down (connection refused) for `poisonDownMs`, then back.
   */
  poisonSampleIds: string[];
  /** How long a poison prompt keeps the server down (wall ms). Default 500. */
  poisonDownMs: number;
  /**
   * Every route but health checks and /_sim/* answers this status with a plausible body
   * (401 `{"detail":"Unauthorized"}`, 404 `{"detail":"Not Found"}`, …); null = off.
   */
  statusAll: number | null;
  /** With `statusAll`: health checks answer it too. */
  statusAllHealth: boolean;
  /**
   * Every POST but /_sim/* (generation, `/abort_request`) answers this status, while GETs
   * (health checks, `/model_info`) are served: a gateway that allows GET only; null = off.
   */
  statusPost: number | null;
  /** Every route but /_sim/* drops its connection (an outage you clear with clearFaults). */
  outage: boolean;
  /** Fraction of generation requests answered with the `badAnswer` shape. */
  badAnswerRate: number;
  /** Which bad answer `badAnswerRate` gives. Default 'wrong-shape'. */
  badAnswer: BadAnswer;
}

export type FaultKind = 'none' | 'error' | 'unavailable' | 'hang' | 'drop' | 'malformed' | 'bad-answer';

export const NO_FAULTS: FaultConfig = {
  errorRate: 0,
  burst503: 0,
  hangRate: 0,
  dropRate: 0,
  malformedRate: 0,
  unhealthy: false,
  firstTry503Rate: 0,
  poisonSampleIds: [],
  poisonDownMs: 500,
  statusAll: null,
  statusAllHealth: false,
  statusPost: null,
  outage: false,
  badAnswerRate: 0,
  badAnswer: 'wrong-shape',
};

function rate(value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || value > 1) {
    throw new RangeError(`fault ${name} must be a number in [0, 1], got ${String(value)}`);
  }
  return value;
}

function bool(value: unknown, name: string): boolean {
  if (typeof value !== 'boolean') throw new RangeError(`fault ${name} must be a boolean, got ${String(value)}`);
  return value;
}

function errorStatus(status: unknown, name: string): number | null {
  if (status !== null && (typeof status !== 'number' || !Number.isInteger(status) || status < 400 || status > 599)) {
    throw new RangeError(`fault ${name} must be an HTTP error status (400-599) or null, got ${String(status)}`);
  }
  return status as number | null;
}

/** The rates drawn per request; together at most 1. */
function rateSum(f: Partial<FaultConfig>): number {
  return (f.errorRate ?? 0) + (f.hangRate ?? 0) + (f.dropRate ?? 0) + (f.malformedRate ?? 0) + (f.badAnswerRate ?? 0);
}

/** Checks a partial fault config (from options or the admin route); throws RangeError. */
export function validateFaults(partial: Partial<FaultConfig>): Partial<FaultConfig> {
  const out: Partial<FaultConfig> = {};
  if (partial.errorRate !== undefined) out.errorRate = rate(partial.errorRate, 'errorRate');
  if (partial.hangRate !== undefined) out.hangRate = rate(partial.hangRate, 'hangRate');
  if (partial.dropRate !== undefined) out.dropRate = rate(partial.dropRate, 'dropRate');
  if (partial.malformedRate !== undefined) out.malformedRate = rate(partial.malformedRate, 'malformedRate');
  if (partial.badAnswerRate !== undefined) out.badAnswerRate = rate(partial.badAnswerRate, 'badAnswerRate');
  if (partial.firstTry503Rate !== undefined) out.firstTry503Rate = rate(partial.firstTry503Rate, 'firstTry503Rate');
  if (partial.burst503 !== undefined) {
    if (typeof partial.burst503 !== 'number' || !Number.isInteger(partial.burst503) || partial.burst503 < 0) {
      throw new RangeError(`fault burst503 must be a non-negative integer, got ${String(partial.burst503)}`);
    }
    out.burst503 = partial.burst503;
  }
  if (partial.unhealthy !== undefined) out.unhealthy = bool(partial.unhealthy, 'unhealthy');
  if (partial.statusAllHealth !== undefined) out.statusAllHealth = bool(partial.statusAllHealth, 'statusAllHealth');
  if (partial.outage !== undefined) out.outage = bool(partial.outage, 'outage');
  if (partial.poisonSampleIds !== undefined) {
    const ids: unknown = partial.poisonSampleIds;
    if (!Array.isArray(ids) || !ids.every((id) => typeof id === 'string' && id !== '')) {
      throw new RangeError('fault poisonSampleIds must be a list of non-empty strings');
    }
    out.poisonSampleIds = [...(ids as string[])];
  }
  if (partial.poisonDownMs !== undefined) {
    const ms: unknown = partial.poisonDownMs;
    if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
      throw new RangeError(`fault poisonDownMs must be a non-negative number, got ${String(ms)}`);
    }
    out.poisonDownMs = ms;
  }
  if (partial.statusAll !== undefined) out.statusAll = errorStatus(partial.statusAll, 'statusAll');
  if (partial.statusPost !== undefined) out.statusPost = errorStatus(partial.statusPost, 'statusPost');
  if (partial.badAnswer !== undefined) {
    if (!(BAD_ANSWERS as readonly unknown[]).includes(partial.badAnswer)) {
      throw new RangeError(
        `fault badAnswer must be one of ${BAD_ANSWERS.join(', ')}, got ${String(partial.badAnswer)}`,
      );
    }
    out.badAnswer = partial.badAnswer;
  }
  if (rateSum(out) > 1 + 1e-9) throw new RangeError('fault rates add up to more than 1');
  return out;
}

/** The sample id a rid stands for: its part before the last `#` (`<dataset>/<sampleId>#<nonce>`; a sample id may hold `#`). */
export function sampleKeyOfRid(rid: string): string {
  const hash = rid.lastIndexOf('#');
  return hash < 0 ? rid : rid.slice(0, hash);
}

/** FNV-1a over the seed and the key, as a fraction in [0, 1). */
function hashFraction(seed: number, key: string): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h / 2 ** 32;
}

/** Decides, request by request, which fault (if any) to inject. Seeded: runs repeat. */
export class FaultInjector {
  private config: FaultConfig = { ...NO_FAULTS };
  private readonly rng: Rng;
  /** Sample ids whose first request has been seen (for `firstTry503Rate`). */
  private readonly triedSamples = new Set<string>();

  constructor(
    private readonly seed: number,
    initial: Partial<FaultConfig> = {},
  ) {
    this.rng = mulberry32((seed ^ 0x5eed_fa17) >>> 0);
    this.set(initial);
  }

  set(partial: Partial<FaultConfig>): void {
    const merged = { ...this.config, ...validateFaults(partial) };
    if (rateSum(merged) > 1 + 1e-9) throw new RangeError('fault rates add up to more than 1');
    this.config = merged;
  }

  clear(): void {
    this.config = { ...NO_FAULTS };
    this.triedSamples.clear();
  }

  current(): FaultConfig {
    return { ...this.config, poisonSampleIds: [...this.config.poisonSampleIds] };
  }

  get unhealthy(): boolean {
    return this.config.unhealthy;
  }

  /**
   * Whether this request's first try is refused (`firstTry503Rate`): true once per chosen
   * sample id, on the first request that names it.
   */
  firstTry503(rids: readonly string[]): boolean {
    const r = this.config.firstTry503Rate;
    if (r === 0) return false;
    let refuse = false;
    for (const rid of rids) {
      const key = sampleKeyOfRid(rid);
      if (this.triedSamples.has(key)) continue;
      this.triedSamples.add(key);
      if (hashFraction(this.seed, key) < r) refuse = true;
    }
    return refuse;
  }

  /** Whether a rid names a poison sample (`poisonSampleIds`, with or without its dataset). */
  isPoison(rid: string): boolean {
    const ids = this.config.poisonSampleIds;
    if (ids.length === 0) return false;
    const key = sampleKeyOfRid(rid);
    const slash = key.indexOf('/');
    return ids.includes(key) || (slash >= 0 && ids.includes(key.slice(slash + 1)));
  }

  /** The fault for the next generation request; consumes one `burst503` when set. */
  next(): FaultKind {
    if (this.config.burst503 > 0) {
      this.config.burst503--;
      return 'unavailable';
    }
    const { errorRate, hangRate, dropRate, malformedRate, badAnswerRate } = this.config;
    if (errorRate + hangRate + dropRate + malformedRate + badAnswerRate === 0) return 'none';
    const u = this.rng();
    let edge = errorRate;
    if (u < edge) return 'error';
    edge += hangRate;
    if (u < edge) return 'hang';
    edge += dropRate;
    if (u < edge) return 'drop';
    edge += malformedRate;
    if (u < edge) return 'malformed';
    edge += badAnswerRate;
    if (u < edge) return 'bad-answer';
    return 'none';
  }
}
