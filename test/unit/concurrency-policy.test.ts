import { describe, expect, it } from 'vitest';
import {
  decideConcurrency,
  INITIAL_POLICY_STATE,
  MIN_GAIN,
  RAISE_FACTOR,
  type PolicyState,
  type WindowObservation,
} from '../../src/workers/inference/concurrency-policy.js';
import { promSum } from '../../src/workers/inference/concurrency-probe.js';

const BOUNDS = { min: 4, max: 1024, maxQueued: 8 };

function window(o: Partial<WindowObservation>): WindowObservation {
  return { cap: 32, inFlight: 32, running: 32, queued: 0, tokensPerSec: 1000, overloads: 0, ...o };
}

describe('sglang.concurrency: auto — one decision per window', () => {
  it('raises while every slot is used, the queue is empty and throughput rises; keeps the cap within max', () => {
    let state: PolicyState = INITIAL_POLICY_STATE;
    let cap = 16;
    const caps = [cap];
    // T(B) rising with B (a server that runs everything it gets).
    for (let i = 0; i < 40; i += 1) {
      const d = decideConcurrency(
        window({ cap, inFlight: cap, running: cap, tokensPerSec: (5000 * cap) / (cap + 100) }),
        state,
        BOUNDS,
      );
      state = d.state;
      cap = d.cap;
      caps.push(cap);
    }
    expect(caps[1]).toBe(Math.round(16 * RAISE_FACTOR));
    expect(caps.every((c, i) => i === 0 || c >= (caps[i - 1] ?? 0))).toBe(true);
    expect(cap).toBe(BOUNDS.max);
  });

  it('goes back when a raise gained less than MIN_GAIN, and holds before probing again', () => {
    const first = decideConcurrency(
      window({ cap: 100, inFlight: 100, running: 100, tokensPerSec: 4000 }),
      INITIAL_POLICY_STATE,
      BOUNDS,
    );
    expect(first.cap).toBe(125);
    const flat = decideConcurrency(
      window({ cap: 125, inFlight: 125, running: 125, tokensPerSec: 4000 * (1 + MIN_GAIN / 2) }),
      first.state,
      BOUNDS,
    );
    expect(flat.cap).toBe(100);
    expect(flat.reason).toMatch(/went back/);
    let state = flat.state;
    let holds = 0;
    for (;;) {
      const d = decideConcurrency(window({ cap: 100, inFlight: 100, running: 100, tokensPerSec: 4000 }), state, BOUNDS);
      state = d.state;
      if (d.cap !== 100) break;
      holds += 1;
    }
    expect(holds).toBeGreaterThanOrEqual(3);
  });

  it('steps back to the running requests plus a short queue when the server queues', () => {
    const d = decideConcurrency(
      window({ cap: 200, inFlight: 200, running: 64, queued: 136 }),
      INITIAL_POLICY_STATE,
      BOUNDS,
    );
    expect(d.cap).toBe(64 + 4);
    expect(d.reason).toMatch(/queues more than 8/);
    // Measured while the server filled up: its peak, not its mean, is what it can run.
    expect(
      decideConcurrency(
        window({ cap: 64, inFlight: 40, running: 4, runningPeak: 8, queued: 17 }),
        INITIAL_POLICY_STATE,
        BOUNDS,
      ).cap,
    ).toBe(8 + 4);
    // A short queue (<= 10% of the running requests, or maxQueued) is what a full server should have: hold.
    const held = decideConcurrency(
      window({ cap: 70, inFlight: 70, running: 64, queued: 6 }),
      INITIAL_POLICY_STATE,
      BOUNDS,
    );
    expect(held.cap).toBe(70);
    expect(held.reason).toMatch(/full/);
  });

  it('cuts the cap on 503s, never below min', () => {
    const d = decideConcurrency(
      window({ cap: 100, inFlight: 60, running: 40, queued: 2, overloads: 3 }),
      INITIAL_POLICY_STATE,
      BOUNDS,
    );
    expect(d.cap).toBe(Math.floor(60 * 0.7));
    expect(d.reason).toMatch(/503/);
    expect(decideConcurrency(window({ cap: 5, inFlight: 5, overloads: 1 }), INITIAL_POLICY_STATE, BOUNDS).cap).toBe(
      BOUNDS.min,
    );
  });

  it('holds while a lowered cap drains, and while demand (not the cap) limits the requests in flight', () => {
    const draining = decideConcurrency(
      window({ cap: 68, inFlight: 90, running: 64, queued: 26 }),
      INITIAL_POLICY_STATE,
      BOUNDS,
    );
    expect(draining.cap).toBe(68);
    expect(draining.reason).toMatch(/drain/);
    const idle = decideConcurrency(window({ cap: 100, inFlight: 40, running: 40 }), INITIAL_POLICY_STATE, BOUNDS);
    expect(idle.cap).toBe(100);
    expect(idle.reason).toMatch(/fewer requests ready/);
  });

  it('steers by the queue alone when the server has no /metrics (no token rate)', () => {
    const up = decideConcurrency(
      window({ cap: 40, inFlight: 40, running: 40, tokensPerSec: null }),
      INITIAL_POLICY_STATE,
      BOUNDS,
    );
    expect(up.cap).toBe(50);
    const again = decideConcurrency(
      window({ cap: 50, inFlight: 50, running: 50, tokensPerSec: null }),
      up.state,
      BOUNDS,
    );
    expect(again.cap).toBe(63);
  });
});

describe('reading SGLang /metrics', () => {
  it('sums a metric over its label sets and ignores other metrics sharing its prefix', () => {
    const text = [
      '# HELP sglang:num_running_reqs The number of running requests.',
      '# TYPE sglang:num_running_reqs gauge',
      'sglang:num_running_reqs{model_name="m",dp_rank="0"} 12.0',
      'sglang:num_running_reqs{model_name="m",dp_rank="1"} 30',
      'sglang:num_running_reqs_offline_batch{model_name="m"} 99',
      'sglang:generation_tokens_total 1.5e3 1700000000000',
    ].join('\n');
    expect(promSum(text, 'sglang:num_running_reqs')).toBe(42);
    expect(promSum(text, 'sglang:generation_tokens_total')).toBe(1500);
    expect(promSum(text, 'sglang:num_queue_reqs')).toBeNull();
  });
});
