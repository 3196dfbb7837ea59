/** The simulator's admin API under /_sim/, for simulators running in another process. */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

import { errorMessage, isRecord } from '../shared/index.js';
import { type FaultConfig, validateFaults } from './faults.js';
import { nativeError, parseJsonBody, readBody, sendJson } from './http-util.js';
import type { SimStats } from './types.js';

/** What the admin routes drive. */
export interface AdminTarget {
  /** `keepSocket`: the admin request's own connection, spared when an outage starts. */
  setFaults(partial: Partial<FaultConfig>, keepSocket?: Socket): void;
  clearFaults(): void;
  currentFaults(): FaultConfig;
  outage(durationMs: number): Promise<void>;
  stats(): SimStats;
  resetStats(): void;
}

/** `POST /_sim/faults {…faults, clear?}` (or `?clear=1`): sets faults, answers the current set. */
export async function adminFaults(
  target: AdminTarget,
  req: IncomingMessage,
  res: ServerResponse,
  url: URL,
): Promise<void> {
  const body = parseJsonBody(await readBody(req), true);
  if (!isRecord(body)) throw nativeError('faults must be a JSON object');
  const { clear, ...rest } = body;
  const clearFirst =
    clear === true || url.searchParams.get('clear') === '1' || url.searchParams.get('clear') === 'true';
  try {
    const validated = validateFaults(rest as Partial<FaultConfig>);
    if (clearFirst) target.clearFaults();
    if (Object.keys(validated).length > 0) target.setFaults(validated, req.socket);
  } catch (e: unknown) {
    throw nativeError(errorMessage(e));
  }
  sendJson(res, 200, target.currentFaults());
}

/** `POST /_sim/outage {durationMs}`: answers, then closes the listener for that long. */
export async function adminOutage(target: AdminTarget, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const body = parseJsonBody(await readBody(req), true);
  const durationMs = isRecord(body) ? body.durationMs : undefined;
  if (typeof durationMs !== 'number' || !(durationMs >= 0))
    throw nativeError('durationMs must be a non-negative number');
  res.on('finish', () => {
    void target.outage(durationMs);
  });
  sendJson(res, 200, { ok: true, durationMs });
}

export function adminStats(target: AdminTarget, res: ServerResponse): void {
  sendJson(res, 200, target.stats());
}

export function adminReset(target: AdminTarget, res: ServerResponse): void {
  target.resetStats();
  sendJson(res, 200, { ok: true });
}
