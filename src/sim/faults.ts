import { mulberry32, type Rng } from './output-model.js';

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
}

export type FaultKind = 'none' | 'error' | 'unavailable' | 'hang' | 'drop' | 'malformed';

export const NO_FAULTS: FaultConfig = {
  errorRate: 0,
  burst503: 0,
  hangRate: 0,
  dropRate: 0,
  malformedRate: 0,
  unhealthy: false,
};

function rate(value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || value > 1) {
    throw new RangeError(`fault ${name} must be a number in [0, 1], got ${String(value)}`);
  }
  return value;
}

/** Checks a partial fault config (from options or the admin route); throws RangeError. */
export function validateFaults(partial: Partial<FaultConfig>): Partial<FaultConfig> {
  const out: Partial<FaultConfig> = {};
  if (partial.errorRate !== undefined) out.errorRate = rate(partial.errorRate, 'errorRate');
  if (partial.hangRate !== undefined) out.hangRate = rate(partial.hangRate, 'hangRate');
  if (partial.dropRate !== undefined) out.dropRate = rate(partial.dropRate, 'dropRate');
  if (partial.malformedRate !== undefined) out.malformedRate = rate(partial.malformedRate, 'malformedRate');
  if (partial.burst503 !== undefined) {
    if (typeof partial.burst503 !== 'number' || !Number.isInteger(partial.burst503) || partial.burst503 < 0) {
      throw new RangeError(`fault burst503 must be a non-negative integer, got ${String(partial.burst503)}`);
    }
    out.burst503 = partial.burst503;
  }
  if (partial.unhealthy !== undefined) {
    if (typeof partial.unhealthy !== 'boolean') throw new RangeError('fault unhealthy must be a boolean');
    out.unhealthy = partial.unhealthy;
  }
  const sum = (out.errorRate ?? 0) + (out.hangRate ?? 0) + (out.dropRate ?? 0) + (out.malformedRate ?? 0);
  if (sum > 1 + 1e-9) throw new RangeError('fault rates add up to more than 1');
  return out;
}

/** Decides, request by request, which fault (if any) to inject. Seeded: runs repeat. */
export class FaultInjector {
  private config: FaultConfig = { ...NO_FAULTS };
  private readonly rng: Rng;

  constructor(seed: number, initial: Partial<FaultConfig> = {}) {
    this.rng = mulberry32((seed ^ 0x5eed_fa17) >>> 0);
    this.set(initial);
  }

  set(partial: Partial<FaultConfig>): void {
    const merged = { ...this.config, ...validateFaults(partial) };
    const sum = merged.errorRate + merged.hangRate + merged.dropRate + merged.malformedRate;
    if (sum > 1 + 1e-9) throw new RangeError('fault rates add up to more than 1');
    this.config = merged;
  }

  clear(): void {
    this.config = { ...NO_FAULTS };
  }

  current(): FaultConfig {
    return { ...this.config };
  }

  get unhealthy(): boolean {
    return this.config.unhealthy;
  }

  /** The fault for the next generation request; consumes one `burst503` when set. */
  next(): FaultKind {
    if (this.config.burst503 > 0) {
      this.config.burst503--;
      return 'unavailable';
    }
    const { errorRate, hangRate, dropRate, malformedRate } = this.config;
    if (errorRate + hangRate + dropRate + malformedRate === 0) return 'none';
    const u = this.rng();
    let edge = errorRate;
    if (u < edge) return 'error';
    edge += hangRate;
    if (u < edge) return 'hang';
    edge += dropRate;
    if (u < edge) return 'drop';
    edge += malformedRate;
    if (u < edge) return 'malformed';
    return 'none';
  }
}
