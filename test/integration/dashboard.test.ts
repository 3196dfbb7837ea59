// The dashboard over real Redis and real HTTP: the token guards every route but /healthz,
// /api/status is the run's status, Bull Board lists and acts on the run's queues, a headless
// Chromium renders it, and the CLI verb starts and stops on SIGTERM.
import { existsSync } from 'node:fs';
import { Queue, Worker } from 'bullmq';
import { chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDashboard, type Dashboard } from '../../src/dashboard/server.js';
import {
  RunKeys,
  TrainKeys,
  generateQueueName,
  loadConfig,
  type Config,
  type RunStatus,
} from '../../src/shared/index.js';
import { judgeHiddenStates } from '../../src/workers/train/hidden-states.js';
import { recordHiddenStates, writeStatus } from '../../src/workers/train/train-jobs.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, waitFor, writeConfig } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';

const CHROMIUM = '/usr/bin/chromium';
const TOKEN = 'dashboard-test-token-0123456789';

const { redis, tmp } = useHarness({ redis: true, tmp: true, cli: true });
let config: Config;
let keys: RunKeys;
let dashboard: Dashboard;
let alpha: Queue;

const bearer = { authorization: `Bearer ${TOKEN}` };
const basic = (user: string, password: string): Record<string, string> => ({
  authorization: `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`,
});

beforeAll(async () => {
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
  const worker = new Worker(queueName, null, {
    connection: redis.connection(),
    prefix: keys.bullPrefix,
    autorun: false,
  });
  const job = await worker.getNextJob('manual-token');
  if (job === undefined) throw new Error('no job to fail');
  await job.moveToFailed(new Error('boom'), 'manual-token');
  await worker.close();
  await alpha.add('batch', { n: 2 }, { jobId: 'alpha-waiting' });
  await redis.connection('client').hset(keys.stats('alpha'), { records: 3, outputTokens: 120, status: 'in_progress' });

  dashboard = await startDashboard({
    redis: redis.connection(),
    keys,
    config,
    host: '127.0.0.1',
    port: 0,
    token: TOKEN,
    logger: quietLogger(),
  });
});

afterAll(async () => {
  await dashboard?.stop();
  await alpha?.close();
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
    for (const path of [
      '/',
      '/api/status',
      '/queues/api/queues',
      '/queues/static/favicon-32x32.png',
      '/queues/queue/generate-alpha',
    ]) {
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
    const other = await startDashboard({
      redis: redis.connection(),
      keys,
      config,
      host: '127.0.0.1',
      port: 0,
      logger: quietLogger(),
    });
    try {
      expect(other.token.length).toBeGreaterThanOrEqual(24);
      expect(other.token).not.toBe(TOKEN);
      expect((await fetch(new URL('/api/status', other.url), { headers: bearer })).status).toBe(401);
      expect(
        (await fetch(new URL('/api/status', other.url), { headers: { authorization: `Bearer ${other.token}` } }))
          .status,
      ).toBe(200);
    } finally {
      await other.stop();
    }
  });
});

/** Every route behind the token, with what a request with the token must get. */
const ROUTES: { method: 'GET' | 'POST'; path: string; what: string; type?: RegExp }[] = [
  { method: 'GET', path: '/', what: 'pipeline page', type: /^text\/html/ },
  { method: 'GET', path: '/index.html', what: 'pipeline page by name', type: /^text\/html/ },
  { method: 'GET', path: '/app.js', what: 'page script (asset)', type: /javascript/ },
  { method: 'GET', path: '/style.css', what: 'page style (asset)', type: /^text\/css/ },
  { method: 'GET', path: '/api/status', what: 'status JSON', type: /^application\/json/ },
  { method: 'GET', path: '/api/history', what: 'throughput history', type: /^application\/json/ },
  { method: 'GET', path: '/api/events', what: 'live updates (SSE)', type: /^text\/event-stream/ },
  { method: 'GET', path: '/metrics', what: 'Prometheus metrics', type: /^text\/plain/ },
  { method: 'GET', path: '/queues', what: 'Bull Board UI', type: /^text\/html/ },
  { method: 'GET', path: '/queues/api/queues', what: 'Bull Board API', type: /^application\/json/ },
  { method: 'GET', path: '/queues/static/favicon-32x32.png', what: 'Bull Board asset', type: /^image\/png/ },
  { method: 'POST', path: '/api/datasets/alpha/resume', what: 'dataset action', type: /^application\/json/ },
];

describe('dashboard: every route but /healthz needs the token', () => {
  for (const route of ROUTES) {
    it(`${route.method} ${route.path} (${route.what}): 401 without the token, 2xx with it`, async () => {
      const url = new URL(route.path, dashboard.url);
      const body = route.method === 'POST' ? '{}' : undefined;
      const json: Record<string, string> = route.method === 'POST' ? { 'content-type': 'application/json' } : {};
      const none = await fetch(url, { method: route.method, headers: json, ...(body === undefined ? {} : { body }) });
      expect(none.status).toBe(401);
      expect(await none.text()).toBe('unauthorized');
      const wrong = await fetch(url, {
        method: route.method,
        headers: { ...json, authorization: 'Bearer not-the-token-at-all' },
        ...(body === undefined ? {} : { body }),
      });
      expect(wrong.status).toBe(401);
      const abort = new AbortController();
      const ok = await fetch(url, {
        method: route.method,
        headers: { ...json, ...basic('tokenmill', TOKEN) },
        signal: abort.signal,
        ...(body === undefined ? {} : { body }),
      });
      expect(ok.status, `${route.method} ${route.path}`).toBeGreaterThanOrEqual(200);
      expect(ok.status).toBeLessThan(300);
      if (route.type !== undefined) expect(ok.headers.get('content-type') ?? '').toMatch(route.type);
      abort.abort(); // the event stream never ends on its own
    });
  }

  it('keeps the token out of the page and its assets', async () => {
    for (const path of ['/', '/app.js', '/style.css']) {
      const text = await (await get(path, bearer)).text();
      expect(text.length, path).toBeGreaterThan(100);
      expect(text, path).not.toContain(TOKEN);
    }
    const page = await (await get('/', bearer)).text();
    expect(page).toContain('href="queues"');
  });

  it('changes the run only by POST, and only from its own origin', async () => {
    const action = new URL('/api/datasets/alpha/pause', dashboard.url);
    const viaGet = await fetch(action, { headers: bearer });
    expect(viaGet.status).toBe(405);
    expect(viaGet.headers.get('allow')).toBe('POST');
    expect(await alpha.isPaused()).toBe(false);
    // A form or script of another site cannot use credentials the browser holds.
    const crossSite = await fetch(action, {
      method: 'POST',
      headers: { ...bearer, origin: 'http://evil.example', 'content-type': 'application/json' },
      body: '{}',
    });
    expect(crossSite.status).toBe(403);
    const fetchSite = await fetch(action, {
      method: 'POST',
      headers: { ...bearer, 'sec-fetch-site': 'cross-site' },
      body: '{}',
    });
    expect(fetchSite.status).toBe(403);
    expect(await alpha.isPaused()).toBe(false);
    const unknown = await fetch(new URL('/api/datasets/nope/pause', dashboard.url), {
      method: 'POST',
      headers: bearer,
    });
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as { error: string }).error).toMatch(/no generation dataset "nope".*alpha/);
    const sameOrigin = await fetch(action, {
      method: 'POST',
      headers: { ...bearer, origin: new URL(dashboard.url).origin },
    });
    expect(sameOrigin.status).toBe(200);
    expect(await alpha.isPaused()).toBe(true);
    const resume = await fetch(new URL('/api/datasets/alpha/resume', dashboard.url), {
      method: 'POST',
      headers: bearer,
    });
    expect(await resume.json()).toEqual({ dataset: 'alpha', action: 'resume' });
    expect(await alpha.isPaused()).toBe(false);
  });

  it('refuses to listen beyond loopback without a configured token', async () => {
    await expect(
      startDashboard({ redis: redis.connection(), keys, config, host: '0.0.0.0', port: 0, logger: quietLogger() }),
    ).rejects.toThrow(
      /refusing to listen on 0\.0\.0\.0 .*without a configured token; set dashboard\.token .* or the DASHBOARD_TOKEN/,
    );
    // With a token it does (and ::1 / localhost never need one).
    const open = await startDashboard({
      redis: redis.connection(),
      keys,
      config,
      host: '0.0.0.0',
      port: 0,
      token: TOKEN,
      logger: quietLogger(),
    });
    await open.stop();
  });
});

describe('dashboard: API', () => {
  it('GET /api/status returns the run status', async () => {
    const res = await get('/api/status', bearer);
    expect(res.status).toBe(200);
    const status = (await res.json()) as RunStatus;
    expect(status.run).toBe('dash');
    expect(status.datasets.map((d) => d.name)).toEqual(['alpha', 'chats']);
    expect(status.datasets[0]).toMatchObject({
      name: 'alpha',
      records: 3,
      outputTokens: 120,
      tokenBudget: 1_000,
      status: 'in_progress',
    });
  });

  it("Bull Board lists the run's queues with the jobs' counts", async () => {
    const res = await get('/queues/api/queues', bearer);
    expect(res.status).toBe(200);
    const body = (await res.json()) as BoardQueues;
    expect(body.queues.map((q) => q.name).sort()).toEqual(['generate-alpha', 'merge', 'tokenize']);
    const q = body.queues.find((x) => x.name === 'generate-alpha');
    expect(q?.counts).toMatchObject({ waiting: 1, failed: 1, active: 0, completed: 0 });
  });

  it("pausing a dataset's queue in Bull Board pauses the dataset; retrying its failed jobs requeues them", async () => {
    const pause = await fetch(new URL('/queues/api/queues/generate-alpha/pause', dashboard.url), {
      method: 'PUT',
      headers: bearer,
    });
    expect(pause.status).toBe(200);
    expect(await alpha.isPaused()).toBe(true);
    const status = (await (await get('/api/status', bearer)).json()) as RunStatus;
    expect(status.datasets[0]?.status).toBe('paused');

    const retry = await fetch(new URL('/queues/api/queues/generate-alpha/retry/failed', dashboard.url), {
      method: 'PUT',
      headers: bearer,
    });
    expect(retry.status).toBe(200);
    const counts = await alpha.getJobCounts('failed', 'waiting');
    expect(counts).toEqual({ failed: 0, waiting: 2 });

    await alpha.resume();
    expect(await alpha.isPaused()).toBe(false);
  });
});

describe('dashboard: train steps', () => {
  it('lists the hidden-state estimate of a train step in /api/status (which the page renders), the page and /metrics', async () => {
    const conn = redis.connection('client');
    const jobId = 'dash-train-1-extract';
    await writeStatus(conn, keys, jobId, { state: 'waiting', waiting: 'hidden states ≈ 80.1 GB, …' }, 'pending', true);
    const { entry } = judgeHiddenStates(
      {
        step: 'extract',
        stepIndex: 0,
        steps: 2,
        where: 'train.steps[0].hiddenStates',
        tokens: 3_473_408,
        tokensFrom: 'merge index',
        dataset: '/data/dash/train-dataset',
        hiddenSize: 2880,
        layers: 4,
        dtype: 'bfloat16',
        bytesPerElement: 2,
        overheadBytesPerToken: 16,
        margin: 0.05,
        configFile: '/models/gpt-oss-120b/config.json',
        bytes: 80_082_894_848,
      },
      { path: '/data', totalBytes: 2e12, freeBytes: 60e9 },
      { minFreeDiskGiB: 0, reusableBytes: 0, chain: 'dash-train-1', jobId },
    );
    await recordHiddenStates(conn, keys, entry);
    try {
      const status = (await (await get('/api/status', bearer)).json()) as RunStatus;
      expect(status.phases.find((p) => p.name === 'train')?.detail).toBe('waiting — hidden states ≈ 80.1 GB, …');
      expect(status.train?.hiddenStates).toMatchObject([
        {
          step: 'extract',
          bytes: 80_082_894_848,
          verdict: 'waiting',
          text: 'hidden states ≈ 80.1 GB (3,473,408 tokens × (2,880 hidden × 4 layers × 2 B bfloat16 + 16 B)); /data: 60.0 GB free of 2.0 TB — waiting for 84.1 GB free',
        },
      ]);
      // The page lists them under the pipeline's phases, from that field.
      expect(await (await get('/', bearer)).text()).toContain('<ul id="train-steps"');
      const app = await (await get('/app.js', bearer)).text();
      expect(app).toContain("$('#train-steps')");
      expect(app).toContain('h.text');
      const metrics = await (await get('/metrics', bearer)).text();
      expect(metrics).toContain('tokenmill_train_step_hidden_states_bytes{run="dash",step="extract"} 80082894848');
    } finally {
      await conn.del(new TrainKeys(keys).status(), new TrainKeys(keys).hiddenStates());
      await conn.hdel(keys.phases(), 'train');
    }
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
      const response = await page.goto(new URL('/queues', dashboard.url).href);
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
  it('refuses a non-loopback --host without a configured token, naming what to set', async () => {
    const configPath = writeConfig(
      tmp.dir,
      {
        run: 'dash',
        redis: { url: redis.url, prefix: redis.prefix },
        datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1_000 }],
        output: { dir: 'out' },
      },
      'cli-open.yaml',
    );
    const cli = spawnCli(['dashboard', '-c', configPath, '--host', '0.0.0.0', '--port', '0']);
    expect(await cli.exited).not.toBe(0);
    expect(cli.output()).toMatch(/refusing to listen on 0\.0\.0\.0 .*DASHBOARD_TOKEN/);
  });

  it('prints the URL and a generated token once, serves, and stops on SIGTERM', async () => {
    const configPath = writeConfig(
      tmp.dir,
      {
        run: 'dash',
        redis: { url: redis.url, prefix: redis.prefix },
        datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1_000 }],
        output: { dir: 'out' },
      },
      'cli.yaml',
    );
    const cli = spawnCli(['dashboard', '-c', configPath, '--host', '127.0.0.1', '--port', '0']);
    const line = (await waitFor(
      () => /tokenmill dashboard: (http:\/\/\S+) \(user "tokenmill", generated token: (\S+);/.exec(cli.output()),
      'the dashboard URL on stderr',
    )) as RegExpExecArray;
    const [, url = '', token = ''] = line;
    expect(token.length).toBeGreaterThanOrEqual(24);
    expect(cli.output().split(token)).toHaveLength(2);
    expect((await fetch(new URL('/healthz', url))).status).toBe(200);
    expect((await fetch(new URL('/queues/api/queues', url))).status).toBe(401);
    const res = await fetch(new URL('/queues/api/queues', url), { headers: { authorization: `Bearer ${token}` } });
    expect(((await res.json()) as BoardQueues).queues.map((q) => q.name)).toContain('generate-alpha');
    cli.child.kill('SIGTERM');
    expect(await cli.exited).toBe(0);
    expect(cli.output().split(token)).toHaveLength(2);
  });
});
