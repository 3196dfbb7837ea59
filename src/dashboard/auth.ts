/**
 * The dashboard's guard: every route but `GET /healthz` needs the token (bearer, or basic auth
 * as user `tokenmill`), requests that change something must come from the dashboard's own page
 * (no cross-site form or script can use a browser's cached credentials), and a dashboard on a
 * non-loopback address needs a token that was configured, not made up.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { AppError, type Logger } from '../shared/index.js';

/** User name of basic auth; the password is the token. */
export const DASHBOARD_USER = 'tokenmill';

function digest(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** Whether an `Authorization` header carries the token (compared in constant time). */
export function authorized(header: string | undefined, expected: Buffer): boolean {
  if (header === undefined) return false;
  const space = header.indexOf(' ');
  if (space < 0) return false;
  const scheme = header.slice(0, space).toLowerCase();
  const value = header.slice(space + 1).trim();
  let given: string | undefined;
  if (scheme === 'bearer') {
    given = value;
  } else if (scheme === 'basic') {
    const decoded = Buffer.from(value, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon >= 0 && decoded.slice(0, colon) === DASHBOARD_USER) given = decoded.slice(colon + 1);
  }
  return given !== undefined && timingSafeEqual(digest(given), expected);
}

/** Express middleware: 401 with a basic-auth challenge unless the request carries the token. */
export function requireToken(token: string, log: Logger): RequestHandler {
  const expected = digest(token);
  return (req: Request, res: Response, next: NextFunction) => {
    if (authorized(req.headers.authorization, expected)) {
      next();
      return;
    }
    // The path only: never headers (the token) or the query string. A browser's first request
    // carries no credentials (it asks for them on the 401): only a wrong token is worth a warning.
    const entry = { method: req.method, path: req.path, ip: req.ip };
    if (req.headers.authorization === undefined) log.debug(entry, 'dashboard request without credentials');
    else log.warn(entry, 'dashboard request with a wrong token');
    res
      .set('WWW-Authenticate', `Basic realm="tokenmill", charset="UTF-8"`)
      .status(401)
      .type('text/plain')
      .send('unauthorized');
  };
}

/**
 * Express middleware: a request that changes something (anything but GET, HEAD, OPTIONS) is
 * refused with 403 when a browser says it comes from another site (`Sec-Fetch-Site`, or an
 * `Origin` that is not this host), so cached basic-auth credentials cannot be used by others.
 */
export function sameOriginWrites(log: Logger): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    if (req.method === 'GET' || req.method === 'HEAD' || req.method === 'OPTIONS') {
      next();
      return;
    }
    const site = req.headers['sec-fetch-site'];
    const origin = req.headers.origin;
    let crossSite = site !== undefined && site !== 'same-origin' && site !== 'none';
    if (!crossSite && origin !== undefined && origin !== 'null') {
      try {
        crossSite = new URL(origin).host !== req.headers.host;
      } catch {
        crossSite = true;
      }
    } else if (origin === 'null') {
      crossSite = true;
    }
    if (!crossSite) {
      next();
      return;
    }
    log.warn({ method: req.method, path: req.path, origin }, 'dashboard write from another site refused');
    res.status(403).type('text/plain').send('forbidden: cross-site request');
  };
}

/** Whether `host` is a loopback address or name (only this machine can reach it). */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost' || h.endsWith('.localhost')) return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) return h === '::1' || /^::ffff:127\./.test(h);
  return false;
}

/**
 * Refuses to serve a non-loopback address without a configured token: a token made up at start
 * is printed to the terminal, and anyone who reads that terminal's log could use it from afar.
 */
export function checkExposure(host: string, tokenConfigured: boolean): void {
  if (tokenConfigured || isLoopbackHost(host)) return;
  throw new AppError(
    `dashboard: refusing to listen on ${host} (reachable from other machines) without a configured token; set dashboard.token in the config or the DASHBOARD_TOKEN environment variable (16+ characters), or listen on 127.0.0.1`,
  );
}
