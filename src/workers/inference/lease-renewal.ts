import type { RunKeys, ScriptedRedis } from '../../shared/index.js';

/** A request's two leases: the dataset's budget reservation and the endpoint slot. */
export interface HeldLease {
  dataset: string;
  rid: string;
  /** The endpoint's lease zset. */
  leaseKey: string;
}

export interface RenewalResult<T extends HeldLease> {
  /** Requests whose slot was taken by others during a stall: abort them and send them again. */
  lost: T[];
  /** Leases that had lapsed and were taken again (the endpoint had room). */
  retaken: number;
}

/**
 * Renews the leases of requests still running in this process (renew-leases.lua). A lease
 * that lapsed during a stall of this process or of Redis is taken again only if the endpoint
 * is below `capPerEndpoint`; otherwise the request is reported lost, so that the cap holds
 * after any stall.
 */
export async function renewLeases<T extends HeldLease>(
  redis: ScriptedRedis,
  keys: RunKeys,
  held: readonly T[],
  ttlMs: number,
  capPerEndpoint: number,
): Promise<RenewalResult<T>> {
  if (held.length === 0) return { lost: [], retaken: 0 };
  const keyArgs: string[] = [];
  const rids: string[] = [];
  for (const h of held) {
    keyArgs.push(keys.inflight(h.dataset), h.leaseKey);
    rids.push(h.rid);
  }
  const codes = await redis.renewLeases(keyArgs.length, ...keyArgs, ttlMs, capPerEndpoint, ...rids);
  const lost: T[] = [];
  let retaken = 0;
  held.forEach((h, i) => {
    const code = Number(codes[i]);
    if (code === 0) lost.push(h);
    else if (code === 2) retaken += 1;
  });
  return { lost, retaken };
}
