/**
 * The dashboard's own routes behind the token: the run's status as JSON, its live updates as
 * server-sent events, the throughput history, `/metrics`, and the per-dataset actions (POST only).
 */
import express, { type Request, type Response, type Router } from 'express';
import type { Redis } from 'ioredis';
import { errorMessage, readRunStatus, type Logger, type RunKeys } from '../shared/index.js';
import { DATASET_ACTIONS, runDatasetAction, type DatasetAction } from './dataset-actions.js';
import type { LiveStatus, LiveUpdate } from './live-status.js';
import { renderMetrics } from './metrics.js';

/** What the routes need. */
export interface ApiRoutesOptions {
  redis: Redis;
  keys: RunKeys;
  config: Parameters<typeof readRunStatus>[2];
  live: LiveStatus;
  logger: Logger;
}

/** SSE comment sent this often so proxies keep the stream open (ms). */
const KEEPALIVE_MS = 15_000;

/** Builds the router of `/api/*` and `/metrics`. */
export function apiRoutes(o: ApiRoutesOptions): Router {
  const router = express.Router();
  const generationDatasets = new Set(o.config.datasets.filter((d) => d.prompts !== undefined).map((d) => d.name));

  router.get('/api/status', async (_req: Request, res: Response) => {
    try {
      res.json(await readRunStatus(o.redis, o.keys, o.config));
    } catch (e: unknown) {
      o.logger.error({ err: e }, 'reading the run status failed');
      res.status(503).json({ error: `reading the run status failed: ${errorMessage(e)}` });
    }
  });

  router.get('/api/history', (_req: Request, res: Response) => {
    res.json({ samples: o.live.history() });
  });

  router.get('/api/events', (req: Request, res: Response) => {
    res.status(200).set({
      'content-type': 'text/event-stream',
      'cache-control': 'no-store',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    });
    res.flushHeaders();
    const send = (u: LiveUpdate): void => {
      res.write(`event: ${u.kind}\ndata: ${JSON.stringify(u)}\n\n`);
    };
    res.write(`event: history\ndata: ${JSON.stringify({ samples: o.live.history() })}\n\n`);
    const latest = o.live.latest();
    if (latest !== undefined) send(latest);
    const unsubscribe = o.live.subscribe(send);
    const keepalive = setInterval(() => res.write(': keepalive\n\n'), KEEPALIVE_MS);
    keepalive.unref();
    req.on('close', () => {
      clearInterval(keepalive);
      unsubscribe();
    });
  });

  router.get('/metrics', async (_req: Request, res: Response) => {
    try {
      const m = await renderMetrics(o.redis, o.keys, o.config);
      res.set('content-type', m.contentType).send(m.body);
    } catch (e: unknown) {
      o.logger.error({ err: e }, 'rendering the metrics failed');
      res
        .status(503)
        .type('text/plain')
        .send(`reading the run state failed: ${errorMessage(e)}\n`);
    }
  });

  router.all('/api/datasets/:dataset/:action', async (req: Request, res: Response) => {
    const dataset = String(req.params['dataset']);
    const action = String(req.params['action']) as DatasetAction;
    if (!DATASET_ACTIONS.includes(action)) {
      res.status(404).json({ error: `no action "${action}" (actions: ${DATASET_ACTIONS.join(', ')})` });
      return;
    }
    if (req.method !== 'POST') {
      res
        .status(405)
        .set('allow', 'POST')
        .json({ error: `${action} changes the run: use POST` });
      return;
    }
    if (!generationDatasets.has(dataset)) {
      res.status(404).json({
        error: `no generation dataset "${dataset}" in the config (datasets: ${[...generationDatasets].join(', ')})`,
      });
      return;
    }
    try {
      const result = await runDatasetAction(o.redis, o.keys, dataset, action);
      o.logger.info({ dataset, action, retried: result.retried }, 'dataset action');
      res.json(result);
    } catch (e: unknown) {
      o.logger.error({ err: e, dataset, action }, 'dataset action failed');
      res.status(500).json({ error: `${action} ${dataset} failed: ${errorMessage(e)}` });
    }
  });

  return router;
}
