// The dashboard over real Redis and real HTTP: the token guards every route but /healthz,
// /api/status is the run's status, Bull Board lists and acts on the run's queues, a headless
// Chromium renders it, and the CLI verb starts and stops on SIGTERM.
import { existsSync } from 'node:fs';
import { Queue, Worker } from 'bullmq';
import { chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDashboard, type Dashboard } from '../../src/dashboard/server.js';
import { RunKeys, generateQueueName, loadConfig, type Config, type RunStatus } from '../../src/shared/index.js';
import { killCliChildren, spawnCli, tempDir, waitFor, writeConfig } from '../helpers/pipeline.js';
import { quietLogger, startTestRedis, type TestRedis } from '../helpers/redis.js';

const CHROMIUM = '/usr/bin/chromium';
const TOKEN = 'dashboard-test-token-0123456789';

let redis: TestRedis;
let tmp: { dir: string; cleanup: () => void };
let config: Config;
let keys: RunKeys;
let dashboard: Dashboard;
let alpha: Queue;

const bearer = { authorization: `Bearer ${TOKEN}` };
const basic = (user: string, password: string): Record<string, string> => ({
  authorization: `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`,
});

beforeAll(async () => {
  redis = await startTestRedis();
  tmp = tempDir();
  config = loadConfig({
    object: {
      run: 'dash',
      redis: { url: redis.url, prefix: redis.prefix },
      datasets: [
        { name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1_000 },
        { name: 'chats', conversations: 'chats.jsonl' },
      ],
      output: { dir: 'out' },
    },
    baseDir: tmp.dir,
  });
  keys = new RunKeys(config.redis.prefix, config.run);

  // One failed job (taken by hand and failed), then one waiting job.
  const queueName = generateQueueName('alpha');
  alpha = new Queue(queueName, { connection: redis.connection(), prefix: keys.bullPrefix });
  await alpha.add('batch', { n: 1 }, { jobId: 'alpha-failed', attempts: 1 });
  const worker = new Worker(queueName, null, { connection: redis.connection(), prefix: keys.bullPrefix, autorun: false });
  const job = await worker.getNextJob('manual-token');
  if (job === undefined) throw new Error('no job to fail');
  await job.moveToFailed(new Error('boom'), 'manual-token');
  await worker.close();
  await alpha.add('batch', { n: 2 }, { jobId: 'alpha-waiting' });
  await redis.connection('client').hset(keys.stats('alpha'), { records: 3, outputTokens: 120, status: 'in_progress' });

  dashboard = await startDashboard({ redis: redis.connection(), keys, config, host: '127.0.0.1', port: 0, token: TOKEN, logger: quietLogger() });
});

afterAll(async () => {
  await killCliChildren();
  await dashboard?.stop();
  await alpha?.close();
  await redis?.stop();
  tmp?.cleanup();
});

async function get(path: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(new URL(path, dashboard.url), { headers });
}

interface BoardQueues {
  queues: { name: string; isPaused: boolean; counts: Record<string, number> }[];
}

describe('dashboard: auth', () => {
  it('answers /healthz without a token', async () => {
    const res = await get('/healthz');
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('ok');
  });

  it('refuses every other route without the token, or with a wrong one', async () => {
    for (const path of ['/', '/api/status', '/api/queues', '/static/favicon-32x32.png', '/queue/generate-alpha']) {
      const none = await get(path);
      expect(none.status, path).toBe(401);
      expect(none.headers.get('www-authenticate'), path).toMatch(/^Basic /);
      expect((await get(path, { authorization: 'Bearer wrong-token' })).status, path).toBe(401);
      expect((await get(path, basic('tokenmill', 'wrong-token'))).status, path).toBe(401);
      expect((await get(path, basic('admin', TOKEN))).status, path).toBe(401);
    }
    // The page itself needs the token; with it, the page is served.
    expect((await get('/', bearer)).status).toBe(200);
    expect((await get('/', basic('tokenmill', TOKEN))).status).toBe(200);
  });

  it('makes up a token when none is given', async () => {
    const other = await startDashboard({ redis: redis.connection(), keys, config, host: '127.0.0.1', port: 0, logger: quietLogger() });
    try {
      expect(other.token.length).toBeGreaterThanOrEqual(24);
      expect(other.token).not.toBe(TOKEN);
      expect((await fetch(new URL('/api/status', other.url), { headers: bearer })).status).toBe(401);
      expect((await fetch(new URL('/api/status', other.url), { headers: { authorization: `Bearer ${other.token}` } })).status).toBe(200);
    } finally {
      await other.stop();
    }
  });
});

describe('dashboard: API', () => {
  it('GET /api/status returns the run status', async () => {
    const res = await get('/api/status', bearer);
    expect(res.status).toBe(200);
    const status = (await res.json()) as RunStatus;
    expect(status.run).toBe('dash');
    expect(status.datasets.map((d) => d.name)).toEqual(['alpha', 'chats']);
    expect(status.datasets[0]).toMatchObject({ name: 'alpha', records: 3, outputTokens: 120, tokenBudget: 1_000, status: 'in_progress' });
  });

  it("Bull Board lists the run's queues with the jobs' counts", async () => {
    const res = await get('/api/queues', bearer);
    expect(res.status).toBe(200);
    const body = (await res.json()) as BoardQueues;
    expect(body.queues.map((q) => q.name).sort()).toEqual(['generate-alpha', 'merge', 'tokenize']);
    const q = body.queues.find((x) => x.name === 'generate-alpha');
    expect(q?.counts).toMatchObject({ waiting: 1, failed: 1, active: 0, completed: 0 });
  });

  it("pausing a dataset's queue in Bull Board pauses the dataset; retrying its failed jobs requeues them", async () => {
    const pause = await fetch(new URL('/api/queues/generate-alpha/pause', dashboard.url), { method: 'PUT', headers: bearer });
    expect(pause.status).toBe(200);
    expect(await alpha.isPaused()).toBe(true);
    const status = (await (await get('/api/status', bearer)).json()) as RunStatus;
    expect(status.datasets[0]?.status).toBe('paused');

    const retry = await fetch(new URL('/api/queues/generate-alpha/retry/failed', dashboard.url), { method: 'PUT', headers: bearer });
    expect(retry.status).toBe(200);
    const counts = await alpha.getJobCounts('failed', 'waiting');
    expect(counts).toEqual({ failed: 0, waiting: 2 });

    await alpha.resume();
    expect(await alpha.isPaused()).toBe(false);
  });
});

describe.skipIf(!existsSync(CHROMIUM))('dashboard: in a browser', () => {
  it('headless Chromium with basic auth shows the dataset queue', async () => {
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
    });
    try {
      const context = await browser.newContext({ httpCredentials: { username: 'tokenmill', password: TOKEN } });
      const page = await context.newPage();
      const response = await page.goto(dashboard.url);
      expect(response?.status()).toBe(200);
      await page.getByText('generate-alpha').first().waitFor({ state: 'visible', timeout: 30_000 });
      expect(await page.content()).toContain('generate-alpha');
    } finally {
      await browser.close();
    }
  });

  it('with a wrong password the browser is refused', async () => {
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
    });
    try {
      const context = await browser.newContext({ httpCredentials: { username: 'tokenmill', password: 'wrong-token' } });
      const page = await context.newPage();
      const response = await page.goto(dashboard.url);
      expect(response?.status()).toBe(401);
      expect(await page.content()).not.toContain('generate-alpha');
    } finally {
      await browser.close();
    }
  });
});

describe('tokenmill dashboard (CLI)', () => {
  it('prints the URL and a generated token once, serves, and stops on SIGTERM', async () => {
    const configPath = writeConfig(tmp.dir, {
      run: 'dash',
      redis: { url: redis.url, prefix: redis.prefix },
      datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1_000 }],
      output: { dir: 'out' },
    }, 'cli.yaml');
    const cli = spawnCli(['dashboard', '-c', configPath, '--host', '127.0.0.1', '--port', '0']);
    const line = (await waitFor(
      () => /tokenmill dashboard: (http:\/\/\S+) \(user "tokenmill", generated token: (\S+);/.exec(cli.output()),
      'the dashboard URL on stderr',
    )) as RegExpExecArray;
    const [, url = '', token = ''] = line;
    expect(token.length).toBeGreaterThanOrEqual(24);
    expect(cli.output().split(token)).toHaveLength(2);
    expect((await fetch(new URL('/healthz', url))).status).toBe(200);
    expect((await fetch(new URL('/api/queues', url))).status).toBe(401);
    const res = await fetch(new URL('/api/queues', url), { headers: { authorization: `Bearer ${token}` } });
    expect(((await res.json()) as BoardQueues).queues.map((q) => q.name)).toContain('generate-alpha');
    cli.child.kill('SIGTERM');
    expect(await cli.exited).toBe(0);
    expect(cli.output().split(token)).toHaveLength(2);
  });
});
