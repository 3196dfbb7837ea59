// The pipeline page and Bull Board in headless Chromium, without a run: a long endpoint reason
// wraps inside its panel (it pushed the workers panel off to the right), a `turns: all` dataset's
// conversations ended early, by cause with an example id each, sit in its row without widening
// the table, and /queues carries the same protective headers as the page (CSP with
// frame-ancestors, nosniff) while Bull Board still renders under them.
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDashboard, type Dashboard } from '../../src/dashboard/server.js';
import { RunKeys, loadConfig, writeEndpointHealth, type Config, type RunStatus } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';

const CHROMIUM = '/usr/bin/chromium';
const TOKEN = 'layout-test-token-0123456789';
const ENDPOINT = 'http://gpu-node-17.cluster.internal:30000';
const LONG_REASON =
  `SGLang endpoint ${ENDPOINT} answered 403 Forbidden to POST /generate (<html><head><title>403 Forbidden</title></head><body>` +
  'request_blocked_by_gateway_policy_allow_get_only_'.repeat(6) +
  '</body></html>): check sglang.apiKey and any proxy in front of the server';

/** A conversation id as long as a content hash of a sample of a turn gets. */
const LONG_CONVERSATION = `h:${'0123456789abcdef'.repeat(4)}#s12`;

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
      datasets: [
        { name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1_000 },
        { name: 'chats', prompts: 'chats.jsonl', turns: 'all', tokenBudget: 1_000 },
      ],
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
  // Conversations ended early, as finish-conversation-4.lua records them: counts and an example per cause.
  const conn = redis.connection('client');
  const ended = [
    { id: LONG_CONVERSATION, turn: 7, reason: `context: turn 7's prompt has 131,412 tokens; ${LONG_REASON}` },
    { id: 'short-1', turn: 2, reason: 'context: turn 2 does not fit' },
    { id: 'bad', turn: 3, reason: 'error: turn 3: System message must be at the beginning of the conversation' },
  ];
  for (const e of ended) {
    const record = JSON.stringify({
      id: e.id,
      kind: 'ended',
      turnsDone: e.turn - 1,
      turns: 9,
      turn: e.turn,
      reason: e.reason,
    });
    await conn.hset(keys.conversations('chats'), e.id, record);
    await conn.lpush(`${keys.stats('chats')}:ended`, record);
  }
  await conn.hset(keys.stats('chats'), {
    records: 40,
    conversationsStarted: 12,
    conversationsComplete: 9,
    conversationsEnded: 3,
    'ended:context': 2,
    'ended-example:context': LONG_CONVERSATION,
    'ended:error': 1,
    'ended-example:error': 'bad',
  });
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

describe('/api/status', () => {
  it('names an example conversation per cause of the early ends', async () => {
    const res = await fetch(new URL('/api/status', dashboard.url), { headers: auth });
    const status = (await res.json()) as RunStatus;
    expect(status.datasets.find((d) => d.name === 'chats')?.conversations).toMatchObject({
      ended: 3,
      endedBy: { context: 2, error: 1 },
      endedExample: { context: LONG_CONVERSATION, error: 'bad' },
    });
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

  it("a dataset's early ends by cause, each with an example id, stay inside its row and the page", async () => {
    const context = await browser!.newContext({
      httpCredentials: { username: 'tokenmill', password: TOKEN },
      viewport: { width: 1280, height: 900 },
    });
    const page = await context.newPage();
    await page.goto(dashboard.url);
    const row = page.locator('#datasets tr[data-dataset="chats"]');
    await row.locator('[data-field="ended-by"]').first().waitFor({ timeout: 10_000 });
    const notes = await row.locator('td[data-field="records"] [data-field="ended-by"]').allInnerTexts();
    expect(notes).toEqual([`2 context · e.g. ${LONG_CONVERSATION}`, '1 error · e.g. bad']);
    expect(await row.locator('[data-cause="context"] [data-field="ended-example"]').innerText()).toBe(
      LONG_CONVERSATION,
    );
    const box = (await page.evaluate(`(() => {
      const table = document.querySelector('#datasets');
      const heads = [...table.querySelectorAll('thead th')].map((h) => h.getBoundingClientRect());
      const rows = [...table.querySelectorAll('tbody tr')].map((r) => [...r.children].map((c) => c.getBoundingClientRect()));
      const section = table.closest('section').getBoundingClientRect();
      return {
        heads: heads.map((h) => ({ left: h.left, right: h.right })),
        rows: rows.map((cells) => cells.map((c) => ({ left: c.left, right: c.right }))),
        table: table.getBoundingClientRect().right,
        section: section.right,
        scroll: document.documentElement.scrollWidth,
        width: window.innerWidth,
      };
    })()`)) as {
      heads: { left: number; right: number }[];
      rows: { left: number; right: number }[][];
      table: number;
      section: number;
      scroll: number;
      width: number;
    };
    const why = JSON.stringify(box);
    expect(box.scroll, why).toBeLessThanOrEqual(box.width);
    expect(box.table, why).toBeLessThanOrEqual(box.section);
    // Every row keeps one cell under each column head.
    expect(box.rows, why).toHaveLength(2);
    for (const cells of box.rows) {
      expect(cells, why).toHaveLength(box.heads.length);
      cells.forEach((c, i) => {
        expect(Math.abs(c.left - box.heads[i]!.left), why).toBeLessThan(1);
        expect(Math.abs(c.right - box.heads[i]!.right), why).toBeLessThan(1);
      });
    }
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
