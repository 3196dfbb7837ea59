/**
 * Endpoint affinity for conversations (`turns: all`): a conversation's next turn goes to the
 * endpoint that served its previous turn (`SampleRequest.preferEndpoint`) while that endpoint is
 * healthy and has a free slot, so that SGLang's radix cache serves the conversation's prefix
 * (`meta_info.cached_tokens`); else it falls through to the cap groups like any sample.
 *
 * Three parts:
 * - A turn asks one endpoint alone first: its preferred one. acquire-request.lua takes the
 *   least loaded of the endpoints it is given (the first on a tie), so putting the preferred
 *   endpoint first in a group would only break ties: it is one more stage before the cap
 *   groups, and a call decides a run of consecutive samples asking the same stage (split
 *   further by dataset in `addAcquires`), each as if alone.
 * - A conversation between two turns holds its slot. From the moment a turn's answer is in
 *   until its next turn asks for a slot (or {@link DEFAULT_AFFINITY_HOLD_MS}), this process
 *   counts one slot of that endpoint as taken: other samples, those ahead of the next turn in
 *   line included, go where a slot is free and not held, or wait. Without the hold, with more
 *   conversations than slots (any real dataset), the slot a turn frees goes at once to a sample
 *   waiting in line, the next turn of that conversation finds its endpoint full and falls
 *   through, and so on: on 8 endpoints only 64 % of the turns went back to their endpoint
 *   (bench/multi-turn-cache.ts, 200 conversations on 64 slots).
 * - While slots are held, every sample asks first the endpoint the plan gave it (the one with
 *   the most room), and an acquire on its way counts as busy for plans made meanwhile (the pump
 *   and the acquires riding on commits plan side by side): acquire-request.lua knows nothing of
 *   the holds and would take the least loaded endpoint, a held slot maybe.
 * The holds are this process's view (other workers do not see them); acquire-request.lua's caps
 * remain the rule. With no slot held (no conversation between turns), a sample without a
 * preference asks the cap groups as before.
 */
import type { AcquireAttempt, RedisPipeline } from './dispatch-acquire.js';
import type { SampleRequest } from './dispatch-types.js';
import type { Endpoint } from './endpoint-pool.js';

/** How long a conversation's slot is held for its next turn at most (a conversation may end without one). */
export const DEFAULT_AFFINITY_HOLD_MS = 1_000;

/** The endpoints of one acquire-request.lua call and the cap they share. */
export interface AcquireStage {
  readonly endpoints: Endpoint[];
  readonly cap: number;
}

/** An attempt and the stages it asks, in order, one per round until it has a slot. */
export interface StagedAttempt {
  readonly attempt: AcquireAttempt;
  readonly stages: readonly AcquireStage[];
}

/** Adds acquire calls for attempts of one stage to a pipeline (the dispatcher's `addAcquires`). */
export type AddAcquires = (
  pipeline: RedisPipeline,
  attempts: AcquireAttempt[],
  endpoints: Endpoint[],
  cap: number,
) => AcquireAttempt[][];

function conversationKey(req: SampleRequest): string | undefined {
  return req.conversation === undefined ? undefined : `${req.dataset}\u0000${req.conversation.id}`;
}

/** The slots held for conversations between turns, in this process. */
export class EndpointAffinity {
  private readonly holds = new Map<string, { url: string; untilMs: number }>();
  /** The endpoint each sample whose acquire is on its way asks first (counted as busy by plans made meanwhile). */
  private readonly asking = new Map<SampleRequest, string>();

  constructor(private readonly holdMs = DEFAULT_AFFINITY_HOLD_MS) {}

  /** A turn's answer is in (before its commit) and more turns follow: its endpoint's slot is held for the next. */
  answered(req: SampleRequest, url: string, nowMs = Date.now()): void {
    const key = conversationKey(req);
    const c = req.conversation;
    if (key === undefined || c === undefined || c.turn >= c.turns) return;
    this.holds.set(key, { url, untilMs: nowMs + this.holdMs });
  }

  /** The conversation ended before its last turn: the slot held for its next turn is free again. */
  release(dataset: string, conversationId: string): void {
    this.holds.delete(`${dataset}\u0000${conversationId}`);
  }

  /** The acquires of these samples are answered (the ones that got a slot are running now). */
  answeredAcquires(reqs: Iterable<SampleRequest>): void {
    for (const r of reqs) this.asking.delete(r);
  }

  /**
   * A pass's view of the slots: each healthy endpoint's room (its cap less this process's
   * requests running on it and the slots held there), to hand out to the samples of one batch.
   * A request whose answer is in (`settling`) is not counted: its slot is being freed (a
   * conversation's hold takes it over), and acquires riding on its commit may take it.
   */
  plan(
    groups: readonly AcquireStage[],
    running: Iterable<{ endpoint: Endpoint; settling: boolean }>,
    nowMs = Date.now(),
  ): AffinityPlan {
    const busy = new Map<string, number>();
    for (const r of running) if (!r.settling) busy.set(r.endpoint.url, (busy.get(r.endpoint.url) ?? 0) + 1);
    for (const url of this.asking.values()) busy.set(url, (busy.get(url) ?? 0) + 1);
    const held = new Map<string, number>();
    let nextLapseMs = Infinity;
    for (const [key, h] of this.holds) {
      if (h.untilMs <= nowMs) {
        this.holds.delete(key);
        continue;
      }
      held.set(h.url, (held.get(h.url) ?? 0) + 1);
      nextLapseMs = Math.min(nextLapseMs, h.untilMs - nowMs);
    }
    return new AffinityPlan(groups, busy, held, nextLapseMs, this.holds, this.asking);
  }
}

/** The stages of the samples of one batch (see {@link EndpointAffinity.plan}). */
export class AffinityPlan {
  private readonly room = new Map<Endpoint, number>();
  private readonly single = new Map<Endpoint, AcquireStage>();
  private readonly anyHeld: boolean;
  private lastOpen: AcquireStage[] = [];
  /** Set when a sample waits for a held slot: when the first hold lapses (ms), Infinity otherwise. */
  waitMs = Infinity;
  /** The stages of each sample {@link admit} let in, in order. */
  readonly admitted: (readonly AcquireStage[])[] = [];

  constructor(
    private readonly groups: readonly AcquireStage[],
    busy: ReadonlyMap<string, number>,
    held: ReadonlyMap<string, number>,
    private readonly nextLapseMs: number,
    /** The live holds: a conversation's next turn takes its own over. */
    private readonly holds: Map<string, { url: string; untilMs: number }>,
    private readonly asking: Map<SampleRequest, string>,
  ) {
    this.anyHeld = held.size > 0;
    for (const g of groups)
      for (const e of g.endpoints) {
        this.room.set(e, g.cap - (busy.get(e.url) ?? 0) - (held.get(e.url) ?? 0));
        this.single.set(e, { endpoints: [e], cap: g.cap });
      }
  }

  /** Whether `req` may ask for a slot in this batch; its stages are added to {@link admitted}. */
  admit(req: SampleRequest): boolean {
    const stages = this.stagesOf(req);
    if (stages !== undefined) this.admitted.push(stages);
    return stages !== undefined;
  }

  /**
   * The stages `req` asks, in order, or undefined when every endpoint's free slots are held for
   * conversations between turns (it waits; {@link waitMs} says until when at most): first one
   * endpoint alone, its preferred one while it has room (else, while slots are held, the one
   * with the most room: acquire-request.lua, which knows nothing of the holds, would take the
   * least loaded, a held slot maybe), then the cap groups, less their endpoints without room
   * while slots are held. Takes the slot of the endpoint it asks first from the room left to the
   * samples after it.
   */
  private stagesOf(req: SampleRequest): readonly AcquireStage[] | undefined {
    const key = conversationKey(req);
    const own = key === undefined ? undefined : this.holds.get(key);
    if (key !== undefined && own !== undefined) {
      // The slot held for this turn is its own to take.
      this.holds.delete(key);
      for (const [e, room] of this.room) if (e.url === own.url) this.room.set(e, room + 1);
    }
    const open = this.anyHeld ? this.openGroups() : [...this.groups];
    const url = req.preferEndpoint;
    let target: Endpoint | undefined;
    for (const [e, room] of this.room) if (e.url === url && room > 0) target = e;
    if (target === undefined && this.anyHeld) target = this.mostRoom(open[0]);
    if (target === undefined) {
      if (open.length === 0) {
        // Nowhere to go (its own endpoint is over its cap): it keeps its hold for the next pass.
        if (key !== undefined && own !== undefined) this.holds.set(key, own);
        this.waitMs = Math.min(this.waitMs, this.nextLapseMs);
        return undefined;
      }
      return open;
    }
    this.room.set(target, (this.room.get(target) ?? 0) - 1);
    this.asking.set(req, target.url);
    return [this.single.get(target) as AcquireStage, ...open];
  }

  /** The cap groups less their endpoints without room (the same objects as the last sample's while unchanged, so runs share calls). */
  private openGroups(): AcquireStage[] {
    const out: AcquireStage[] = [];
    for (const g of this.groups) {
      const endpoints = g.endpoints.filter((e) => (this.room.get(e) ?? 0) > 0);
      if (endpoints.length > 0) out.push(endpoints.length === g.endpoints.length ? g : { endpoints, cap: g.cap });
    }
    const last = this.lastOpen;
    const same =
      last.length === out.length &&
      out.every((s, i) => {
        const l = last[i] as AcquireStage;
        return (
          l.cap === s.cap &&
          l.endpoints.length === s.endpoints.length &&
          l.endpoints.every((e, j) => e === s.endpoints[j])
        );
      });
    if (same) return last;
    this.lastOpen = out;
    return out;
  }

  /** The endpoint of `stage` with the most room (the first, least loaded, on a tie). */
  private mostRoom(stage: AcquireStage | undefined): Endpoint | undefined {
    let best: Endpoint | undefined;
    for (const e of stage?.endpoints ?? [])
      if (best === undefined || (this.room.get(e) ?? 0) > (this.room.get(best) ?? 0)) best = e;
    return best;
  }
}

/** Each attempt with the stages its plan gave it. */
export function staged(
  attempts: readonly AcquireAttempt[],
  stages: readonly (readonly AcquireStage[])[],
): StagedAttempt[] {
  return attempts.map((attempt, i) => ({ attempt, stages: stages[i] ?? [] }));
}

/**
 * Adds one round's calls to `pipeline`: each attempt asks its `round`-th stage; consecutive
 * attempts asking the same stage go in one `add` call, the order of `open` kept. Returns the
 * attempts of each acquire-request.lua call, in pipeline order (for `readAcquires`).
 */
export function addRound(
  pipeline: RedisPipeline,
  open: readonly StagedAttempt[],
  round: number,
  add: AddAcquires,
): AcquireAttempt[][] {
  const calls: AcquireAttempt[][] = [];
  let run: AcquireAttempt[] = [];
  let stage: AcquireStage | undefined;
  const flush = (): void => {
    if (stage !== undefined && run.length > 0) calls.push(...add(pipeline, run, stage.endpoints, stage.cap));
    run = [];
  };
  for (const s of open) {
    const next = s.stages[round];
    if (next === undefined) continue;
    if (next !== stage) {
      flush();
      stage = next;
    }
    run.push(s.attempt);
  }
  flush();
  return calls;
}

/** The attempts that found every endpoint of their `round`-th stage full and have a stage after it. */
export function stillOpen(open: readonly StagedAttempt[], round: number): StagedAttempt[] {
  return open.filter((s) => s.attempt.error === undefined && s.attempt.code === -1 && s.stages.length > round + 1);
}
