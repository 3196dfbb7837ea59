// The dashboard: Bull Board over every queue of one run, and the run's progress as JSON, behind
// a token. Everything but `GET /healthz` needs the token (bearer, or basic auth as `tokenmill`).
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { ExpressAdapter } from '@bull-board/express';
import { Queue } from 'bullmq';
import express, { type NextFunction, type Request, type Response } from 'express';
import type { Redis } from 'ioredis';
import {
  MERGE_QUEUE,
  TOKENIZE_QUEUE,
  generateQueueName,
  logger as componentLogger,
  readRunStatus,
  type Config,
  type Logger,
  type RunKeys,
} from '../shared/index.js';

/** User name of basic auth; the password is the token. */
export const DASHBOARD_USER = 'tokenmill';

export interface DashboardOptions {
  /** The run's Redis (a `worker`-role connection); owned by the caller, never closed here. */
  redis: Redis;
  keys: RunKeys;
  /** With `sglang.endpoints`, /api/status includes the endpoints' health. */
  config: Pick<Config, 'run' | 'datasets'> & { sglang?: Pick<Config['sglang'], 'endpoints'> };
  host: string;
  /** TCP port; 0 picks a free one. */
  port: number;
  /** The access token; omitted = a random one (read it from the result). */
  token?: string;
  logger?: Logger;
}

export interface Dashboard {
  /** `http://<host>:<port>/` (without credentials). */
  url: string;
  token: string;
  /** Closes the HTTP server, then the queues. */
  stop(): Promise<void>;
}

/** The queues Bull Board shows: one per generation dataset, then tokenize and merge. */
export function dashboardQueueNames(config: Pick<Config, 'datasets'>): string[] {
  return [...config.datasets.filter((d) => d.prompts !== undefined).map((d) => generateQueueName(d.name)), TOKENIZE_QUEUE, MERGE_QUEUE];
}

function digest(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** Whether an `Authorization` header carries the token (compared in constant time). */
function authorized(header: string | undefined, expected: Buffer): boolean {
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

/** Starts the dashboard's HTTP server; resolves once it listens. */
export async function startDashboard(options: DashboardOptions): Promise<Dashboard> {
  const log = options.logger ?? componentLogger('dashboard');
  const token = options.token ?? randomBytes(24).toString('base64url');
  const expected = digest(token);

  // A shared connection: Queue.close() leaves it open, the caller closes it.
  const queues = dashboardQueueNames(options.config).map(
    (name) => new Queue(name, { connection: options.redis, prefix: options.keys.bullPrefix }),
  );
  const serverAdapter = new ExpressAdapter();
  createBullBoard({
    queues: queues.map((q) => new BullMQAdapter(q)),
    serverAdapter,
    options: { uiConfig: { boardTitle: `tokenmill · ${options.config.run}` } },
  });

  const app = express();
  app.disable('x-powered-by');
  app.get('/healthz', (_req: Request, res: Response) => {
    res.type('text/plain').send('ok');
  });
  app.use((req: Request, res: Response, next: NextFunction) => {
    if (authorized(req.headers.authorization, expected)) {
      next();
      return;
    }
    log.warn({ method: req.method, path: req.path, ip: req.ip }, 'dashboard request without a valid token');
    res.set('WWW-Authenticate', `Basic realm="tokenmill", charset="UTF-8"`).status(401).type('text/plain').send('unauthorized');
  });
  app.get('/api/status', async (_req: Request, res: Response) => {
    try {
      res.json(await readRunStatus(options.redis, options.keys, options.config));
    } catch (e: unknown) {
      log.error({ err: e }, 'reading the run status failed');
      res.status(500).json({ error: 'reading the run status failed' });
    }
  });
  app.use('/', serverAdapter.getRouter() as express.Router);

  const server: Server = createServer(app);
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(options.port, options.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (e: unknown) {
    await Promise.all(queues.map((q) => q.close()));
    throw e;
  }
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  const url = `http://${host}:${address.port}/`;
  log.info({ url, queues: queues.map((q) => q.name) }, 'dashboard listening');

  let stopping: Promise<void> | undefined;
  return {
    url,
    token,
    stop(): Promise<void> {
      stopping ??= (async () => {
        // 1. the HTTP server: no new requests; idle keep-alive connections (browsers) are closed
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          server.closeIdleConnections();
          // in-flight requests get a moment, then their connections go too
          setTimeout(() => server.closeAllConnections(), 2_000).unref();
        });
        // 2. the queues (Redis itself belongs to the caller)
        await Promise.all(queues.map((q) => q.close()));
        log.info('dashboard stopped');
      })();
      return stopping;
    },
  };
}
