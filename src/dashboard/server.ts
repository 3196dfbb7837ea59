// The dashboard: the pipeline page at `/`, Bull Board over every queue of one run at `/queues`,
// the run's status as JSON and live events, `/metrics` for Prometheus, and per-dataset actions,
// all behind a token. Everything but `GET /healthz` needs the token (bearer, or basic auth as
// `tokenmill`).
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { ExpressAdapter } from '@bull-board/express';
import { Queue } from 'bullmq';
import express, { type Request, type Response } from 'express';
import type { Redis } from 'ioredis';
import {
  AppError,
  EVAL_QUEUE,
  MERGE_QUEUE,
  TOKENIZE_QUEUE,
  TRAIN_QUEUE,
  errorCode,
  generateQueueName,
  logger as componentLogger,
  type Config,
  type Logger,
  type RunKeys,
} from '../shared/index.js';
import { apiRoutes } from './api-routes.js';
import { checkExposure, requireToken, sameOriginWrites } from './auth.js';
import { LiveStatus } from './live-status.js';
import { bullBoardHeaders, pageRoutes } from './page.js';

export { DASHBOARD_USER, isLoopbackHost } from './auth.js';

/** Where Bull Board is mounted. */
export const BULL_BOARD_PATH = '/queues';

export interface DashboardOptions {
  /** The run's Redis (a `worker`-role connection); owned by the caller, never closed here. */
  redis: Redis;
  keys: RunKeys;
  /** With `sglang.endpoints`, the status includes the endpoints' health and requests. */
  config: Pick<Config, 'run' | 'datasets'> & { sglang?: Pick<Config['sglang'], 'endpoints'> };
  host: string;
  /** TCP port; 0 picks a free one. */
  port: number;
  /**
   * The access token; omitted = a random one (read it from the result), allowed only on a
   * loopback address.
   */
  token?: string;
  /** How often the page's live status is read (ms); default 2 000. */
  pollMs?: number;
  logger?: Logger;
}

export interface Dashboard {
  /** `http://<host>:<port>/` (without credentials). */
  url: string;
  token: string;
  /** Closes the HTTP server, then the live status, then the queues. */
  stop(): Promise<void>;
}

/**
 * The queues Bull Board shows: one per generation dataset, then tokenize and merge, then train
 * when configured, and eval when both train and eval are (the eval step after each training).
 */
export function dashboardQueueNames(config: Pick<Config, 'datasets'> & { train?: unknown; eval?: unknown }): string[] {
  const train = config.train === undefined ? [] : config.eval === undefined ? [TRAIN_QUEUE] : [TRAIN_QUEUE, EVAL_QUEUE];
  return [
    ...config.datasets.filter((d) => d.prompts !== undefined).map((d) => generateQueueName(d.name)),
    TOKENIZE_QUEUE,
    MERGE_QUEUE,
    ...train,
  ];
}

/** Starts the dashboard's HTTP server; resolves once it listens. */
export async function startDashboard(options: DashboardOptions): Promise<Dashboard> {
  const log = options.logger ?? componentLogger('dashboard');
  checkExposure(options.host, options.token !== undefined);
  const token = options.token ?? randomBytes(24).toString('base64url');

  // A shared connection: Queue.close() leaves it open, the caller closes it.
  const queues = dashboardQueueNames(options.config).map(
    (name) => new Queue(name, { connection: options.redis, prefix: options.keys.bullPrefix }),
  );
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(BULL_BOARD_PATH);
  createBullBoard({
    queues: queues.map((q) => new BullMQAdapter(q)),
    serverAdapter,
    options: { uiConfig: { boardTitle: `tokenmill · ${options.config.run}` } },
  });
  const live = new LiveStatus({
    redis: options.redis,
    keys: options.keys,
    config: options.config,
    ...(options.pollMs === undefined ? {} : { pollMs: options.pollMs }),
    logger: log,
  });

  const app = express();
  app.disable('x-powered-by');
  app.get('/healthz', (_req: Request, res: Response) => {
    res.type('text/plain').send('ok');
  });
  app.use(requireToken(token, log));
  app.use(sameOriginWrites(log));
  app.use(apiRoutes({ redis: options.redis, keys: options.keys, config: options.config, live, logger: log }));
  app.use(BULL_BOARD_PATH, bullBoardHeaders(), serverAdapter.getRouter() as express.Router);
  app.use(pageRoutes());

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
    const code = errorCode(e);
    if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL') {
      const why =
        code === 'EADDRINUSE'
          ? 'the port is already in use'
          : code === 'EACCES'
            ? 'the port may not be used by this user'
            : 'the host is not an address of this machine';
      throw new AppError(
        `the dashboard cannot listen on ${options.host}:${options.port}: ${why} (${code}); choose another with --port / --host or dashboard.port / dashboard.host in the config`,
        { cause: e },
      );
    }
    throw e;
  }
  live.start();
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
        // 1. the HTTP server: no new requests; idle keep-alive connections (browsers) and
        //    event streams are closed
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          server.closeIdleConnections();
          // in-flight requests get a moment, then their connections go too
          setTimeout(() => server.closeAllConnections(), 2_000).unref();
        });
        // 2. the live status poller, 3. the queues (Redis itself belongs to the caller)
        await live.stop();
        await Promise.all(queues.map((q) => q.close()));
        log.info('dashboard stopped');
      })();
      return stopping;
    },
  };
}
