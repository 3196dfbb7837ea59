import {
  AppError,
  CancelledError,
  EndpointMisconfiguredError,
  TimeoutError,
  UnavailableError,
  UpstreamHttpError,
  errorCode,
} from '../../shared/index.js';
import type { Endpoint } from './endpoint-pool.js';

/**
 * What a failed request means (docs/design.md, invariant 7: an outage is not a failure):
 * - `cancelled`: this process aborted it (stopping, or its endpoint slot was lost);
 * - `outage`: the endpoint cannot serve now (refused, 503, or a timeout/5xx while its health
 *   check fails): wait for it, spend nothing;
 * - `endpoint-misconfigured`: a 4xx that every request to this endpoint would get (401/403
 *   from a proxy or a missing API key, 404 from a wrong base path, …): out of rotation, spend
 *   nothing;
 * - `connection-dropped`: the server dropped the connection of a request it had accepted — a
 *   crash, possibly caused by this very prompt; see the dispatcher's probation;
 * - `retry`: the request failed against a healthy server: spend an attempt;
 * - `fail`: the prompt itself is refused (400, 413, 422): fail it now.
 */
export type Verdict = 'cancelled' | 'outage' | 'endpoint-misconfigured' | 'connection-dropped' | 'retry' | 'fail';

/** Socket codes of a connection that was up and then cut (not one refused at connect). */
const DROPPED_CODES = new Set(['ECONNRESET', 'UND_ERR_SOCKET', 'EPIPE', 'ECONNABORTED']);

export async function triage(endpoint: Endpoint, e: unknown): Promise<Verdict> {
  if (e instanceof CancelledError) return 'cancelled';
  if (e instanceof EndpointMisconfiguredError) return 'endpoint-misconfigured';
  if (e instanceof UnavailableError) {
    const code = errorCode(e);
    return code !== undefined && DROPPED_CODES.has(code) ? 'connection-dropped' : 'outage';
  }
  if (e instanceof UpstreamHttpError && e.status === 503) return 'outage';
  const retryable = e instanceof AppError ? e.retryable : true;
  if (!retryable) return 'fail';
  if (e instanceof TimeoutError || e instanceof UpstreamHttpError) {
    // A hung or failing request on a server whose health check fails is the server's fault.
    const h = await endpoint.client.healthGenerate();
    if (!h.ok) return 'outage';
  }
  return 'retry';
}
