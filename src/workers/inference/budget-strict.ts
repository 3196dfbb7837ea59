import type { Logger, RunKeys, ScriptedRedis } from '../../shared/index.js';

/** A streamed request of a `budget: strict` dataset, as far as it has come. */
interface Tracked {
  dataset: string;
  rid: string;
  produced: number;
  /** Produced as last reported to Redis. */
  reported: number;
  /** Stopped by the budget: its abort was asked of the server. */
  stopped: boolean;
}

export interface StrictBudgetOptions {
  redis: ScriptedRedis;
  keys: RunKeys;
  /** How often the progress of the requests is reported and the stop flag read (ms). */
  intervalMs?: number;
  /** The budget is met: abort these requests on their server (their partial outputs are committed). */
  onStop(dataset: string, rids: readonly string[]): void;
  log: Logger;
}

/** Default report interval: at ~1,000 output tokens/s per server this lets ~100 tokens by. */
export const STRICT_REPORT_INTERVAL_MS = 100;

/**
 * `budget: strict` (docs/design.md, invariant 3, tightened): the requests of a strict dataset are
 * streamed, their tokens so far reported to Redis every `intervalMs` (budget-progress-2.lua, one
 * call per dataset with requests here), and once the tokens committed plus those produced in flight
 * (over every worker) reach the budget, the script sets the dataset's stop flag and every worker
 * aborts what it has in flight for it (each learns it at its next report). The final count then
 * lands within the budget plus what the requests produced between the report and the abort.
 */
export class StrictBudget {
  private readonly tracked = new Map<string, Tracked>();
  private readonly intervalMs: number;
  private timer: NodeJS.Timeout | undefined;
  private reporting = false;

  constructor(private readonly options: StrictBudgetOptions) {
    this.intervalMs = options.intervalMs ?? STRICT_REPORT_INTERVAL_MS;
  }

  /** Follows a request; returns the callback its stream tells its tokens to. */
  track(dataset: string, rid: string): (completionTokens: number) => void {
    const t: Tracked = { dataset, rid, produced: 0, reported: 0, stopped: false };
    this.tracked.set(rid, t);
    this.ensureTimer();
    return (n) => {
      if (n > t.produced) t.produced = n;
    };
  }

  /** The request ended; whether it was stopped by the budget (its abort is then expected). */
  untrack(rid: string): boolean {
    const t = this.tracked.get(rid);
    this.tracked.delete(rid);
    if (this.tracked.size === 0) this.clearTimer();
    return t?.stopped === true;
  }

  /** Whether the request was stopped by the budget. */
  stopped(rid: string): boolean {
    return this.tracked.get(rid)?.stopped === true;
  }

  stop(): void {
    this.clearTimer();
  }

  private ensureTimer(): void {
    if (this.timer !== undefined) return;
    this.timer = setInterval(() => void this.report(), this.intervalMs);
    this.timer.unref();
  }

  private clearTimer(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One report per dataset with requests here: their progress in, the stop flag out. */
  async report(): Promise<void> {
    if (this.reporting) return;
    this.reporting = true;
    const { redis, keys } = this.options;
    try {
      const byDataset = new Map<string, Tracked[]>();
      for (const t of this.tracked.values()) {
        if (t.stopped) continue;
        const list = byDataset.get(t.dataset) ?? [];
        list.push(t);
        byDataset.set(t.dataset, list);
      }
      await Promise.all(
        [...byDataset].map(async ([dataset, list]) => {
          const args: (string | number)[] = [];
          for (const t of list) if (t.produced > t.reported) args.push(t.rid, t.produced);
          const produced = list.map((t) => t.produced);
          const stop = await redis.budgetProgress(keys.inflight(dataset), keys.stats(dataset), ...args);
          list.forEach((t, i) => {
            t.reported = Math.max(t.reported, produced[i] ?? 0);
          });
          if (Number(stop) !== 1) return;
          const rids: string[] = [];
          // Every request of the dataset running here now, including those started meanwhile.
          for (const t of this.tracked.values()) {
            if (t.dataset !== dataset || t.stopped) continue;
            t.stopped = true;
            rids.push(t.rid);
          }
          if (rids.length > 0) this.options.onStop(dataset, rids);
        }),
      );
    } catch (e: unknown) {
      this.options.log.warn({ err: e }, 'could not report the progress of strict-budget requests');
    } finally {
      this.reporting = false;
    }
  }
}
