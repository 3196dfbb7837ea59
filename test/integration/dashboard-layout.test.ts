// The pipeline page and Bull Board in headless Chromium, without a run: a long endpoint reason
// wraps inside its panel (it pushed the workers panel off to the right), and /queues carries
// the same protective headers as the page (CSP with frame-ancestors, nosniff) while Bull Board
// still renders under them.
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDashboard, type Dashboard } from '../../src/dashboard/server.js';
import { RunKeys, loadConfig, writeEndpointHealth, type Config } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';

const CHROMIUM = '/usr/bin/chromium';
const TOKEN = 'layout-test-token-0123456789';
const ENDPOINT = 'http://gpu-node-17.cluster.internal:30000';
const LONG_REASON =
  `SGLang endpoint ${ENDPOINT} answered 403 Forbidden to POST /generate (<html><head><title>403 Forbidden</title></head><body>` +
  'request_blocked_by_gateway_policy_allow_get_only_'.repeat(6) +
  '</body></html>): check sglang.apiKey and any proxy in front of the server';

const { redis, tmp } = useHarness({ redis: true, tmp: true });
let config: Config;
let dashboard: Dashboard;
let browser: Browser | undefined;

beforeAll(async () => {
  config = loadConfig({
    object: {
      run: 'layout',
      redis: { url: redis.url, prefix: redis.prefix },
      sglang: { endpoints: [ENDPOINT] },
      datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1_000 }],
      output: { dir: 'out' },
    },
    baseDir: tmp.dir,
  });
  const keys = new RunKeys(config.redis.prefix, config.run);
  const now = Date.now();
  await writeEndpointHealth(redis.connection('client'), keys, [
    {
      url: ENDPOINT,
      up: false,
      reason: LONG_REASON,
      sinceMs: now - 5_000,
      worker: 'gpu-1:4242',
      updatedMs: now,
      expiresMs: now + 3_600_000,
    },
  ]);
  dashboard = await startDashboard({
    redis: redis.connection(),
    keys,
    config,
    host: '127.0.0.1',
    port: 0,
    token: TOKEN,
    pollMs: 500,
    logger: quietLogger(),
  });
});

afterAll(async () => {
  await browser?.close();
  await dashboard?.stop();
});

const auth = { authorization: `Bearer ${TOKEN}` };

describe('/queues headers', () => {
  it('Bull Board pages and assets carry CSP (frame-ancestors none), nosniff and a frame ban, like the pipeline page', async () => {
    for (const path of [
      '/queues',
      '/queues/queue/generate-alpha',
      '/queues/api/queues',
      '/queues/static/favicon-32x32.png',
    ]) {
      const res = await fetch(new URL(path, dashboard.url), { headers: auth });
      expect(res.status, path).toBe(200);
      const csp = res.headers.get('content-security-policy') ?? '';
      expect(csp, path).toContain("frame-ancestors 'none'");
      expect(csp, path).toContain("script-src 'self'");
      expect(csp, path).toContain("default-src 'self'");
      expect(res.headers.get('x-content-type-options'), path).toBe('nosniff');
      expect(res.headers.get('x-frame-options'), path).toBe('DENY');
      await res.arrayBuffer();
    }
  });
});

describe.skipIf(!existsSync(CHROMIUM))('in a browser', () => {
  beforeAll(async () => {
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
    });
  }, 60_000);

  it('a long endpoint reason wraps inside its panel; the workers panel stays on the page', async () => {
    const context = await browser!.newContext({
      httpCredentials: { username: 'tokenmill', password: TOKEN },
      viewport: { width: 1280, height: 900 },
    });
    const page = await context.newPage();
    await page.goto(dashboard.url);
    await page.locator('#endpoints tbody tr').first().waitFor({ timeout: 10_000 });
    await page.locator('#endpoints tbody tr td.down').first().waitFor({ timeout: 10_000 });
    // A string, evaluated in the page (the test's TypeScript has no DOM types).
    const box = (await page.evaluate(`(() => {
      const panels = [...document.querySelectorAll('section.two > div')].map((d) => d.getBoundingClientRect());
      const section = document.querySelector('section.two').getBoundingClientRect();
      return { panels: panels.map((p) => ({ left: p.left, right: p.right })), section: { left: section.left, right: section.right }, scroll: document.documentElement.scrollWidth, width: window.innerWidth };
    })()`)) as {
      panels: { left: number; right: number }[];
      section: { left: number; right: number };
      scroll: number;
      width: number;
    };
    expect(box.panels).toHaveLength(2);
    const [endpoints, workers] = box.panels;
    expect(box.scroll, JSON.stringify(box)).toBeLessThanOrEqual(box.width);
    expect(workers!.right, JSON.stringify(box)).toBeLessThanOrEqual(box.section.right + 1);
    expect(endpoints!.right, JSON.stringify(box)).toBeLessThanOrEqual(workers!.left);
    // The two panels share the row about evenly.
    expect(workers!.right - workers!.left).toBeGreaterThan((box.section.right - box.section.left) / 3);
    await context.close();
  }, 30_000);

  it("Bull Board still renders under its policy: the queue list shows the run's queue", async () => {
    const context = await browser!.newContext({
      httpCredentials: { username: 'tokenmill', password: TOKEN },
      viewport: { width: 1280, height: 900 },
    });
    const page = await context.newPage();
    const refusedScripts: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error' && /Refused to (execute|load the script|apply inline style)/.test(m.text()))
        refusedScripts.push(m.text());
    });
    await page.goto(new URL('/queues', dashboard.url).href);
    await page.getByText('generate-alpha').first().waitFor({ timeout: 15_000 });
    expect(refusedScripts).toEqual([]);
    await context.close();
  }, 30_000);
});
