// The pipeline page and Bull Board in headless Chromium, without a run: a long endpoint reason
// wraps inside its panel (it pushed the workers panel off to the right), a `turns: all` dataset's
// conversations ended early, by cause with an example id each, sit in its row without widening
// the table, and /queues carries the same protective headers as the page (CSP with
// frame-ancestors, nosniff) while Bull Board still renders under them. With the demo's content
// (eight datasets, two of them multi-turn with conversation notes, an eval of every dataset run
// against the simulator), the drafter-evaluation and datasets cards hold what they show at 1280
// and 1024 px, and the eval says its figures are the simulator's configured ones.
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDashboard, type Dashboard } from '../../src/dashboard/server.js';
import {
  EvalKeys,
  RunKeys,
  loadConfig,
  writeEndpointHealth,
  type Config,
  type RunStatus,
} from '../../src/shared/index.js';
import {
  buildReport,
  emptyTotals,
  type DrafterEndpointInfo,
  type EvalReport,
  type PhaseTotals,
  type SimulatorInfo,
} from '../../src/workers/index.js';
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
  // An eval measured on SGLang (its servers made no simulator announcement).
  const measured = demoReport('0001', 1, undefined, true);
  await conn.hset(new EvalKeys(keys).reports(), '0001', JSON.stringify({ ...measured, run: 'layout' }));
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

  it("a dataset's early ends by cause, each with an example id, stay in its notes row, inside the table and the page", async () => {
    const context = await browser!.newContext({
      httpCredentials: { username: 'tokenmill', password: TOKEN },
      viewport: { width: 1280, height: 900 },
    });
    const page = await context.newPage();
    await page.goto(dashboard.url);
    // The notes have a row of their own, right under the dataset's figures, across every column.
    const row = page.locator('#datasets tr[data-notes-of="chats"]');
    await row.locator('[data-field="ended-by"]').first().waitFor({ timeout: 10_000 });
    expect(
      await page.evaluate(
        `document.querySelector('#datasets tr[data-dataset="chats"]').nextElementSibling.dataset.notesOf`,
      ),
    ).toBe('chats');
    const notes = await row.locator('td [data-field="ended-by"]').allInnerTexts();
    expect(notes).toEqual([`2 context · e.g. ${LONG_CONVERSATION}`, '1 error · e.g. bad']);
    expect(await row.locator('[data-cause="context"] [data-field="ended-example"]').innerText()).toBe(
      LONG_CONVERSATION,
    );
    const box = (await page.evaluate(`(() => {
      const table = document.querySelector('#datasets');
      const heads = [...table.querySelectorAll('thead th')].map((h) => h.getBoundingClientRect());
      const rows = [...table.querySelectorAll('tbody tr[data-dataset]')].map((r) => [...r.children].map((c) => c.getBoundingClientRect()));
      const section = table.closest('section').getBoundingClientRect();
      const notes = table.querySelector('tr[data-notes-of="chats"] > td').getBoundingClientRect();
      return {
        notes: { left: notes.left, right: notes.right, colSpan: table.querySelector('tr[data-notes-of="chats"] > td').colSpan },
        heads: heads.map((h) => ({ left: h.left, right: h.right })),
        rows: rows.map((cells) => cells.map((c) => ({ left: c.left, right: c.right }))),
        table: table.getBoundingClientRect().right,
        section: section.right,
        scroll: document.documentElement.scrollWidth,
        width: window.innerWidth,
      };
    })()`)) as {
      notes: { left: number; right: number; colSpan: number };
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
    // The notes span the table; every dataset's row keeps one cell under each column head.
    expect(box.notes.colSpan, why).toBe(box.heads.length);
    expect(Math.abs(box.notes.left - box.heads[0]!.left), why).toBeLessThan(1);
    expect(Math.abs(box.notes.right - box.heads.at(-1)!.right), why).toBeLessThan(1);
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

  it('an eval measured on SGLang says nothing of simulation: no notice, no configured column', async () => {
    const context = await browser!.newContext({
      httpCredentials: { username: 'tokenmill', password: TOKEN },
      viewport: { width: 1280, height: 900 },
    });
    const page = await context.newPage();
    await page.goto(dashboard.url);
    await page.locator('#eval-datasets tr[data-dataset="overall"]').waitFor({ timeout: 10_000 });
    expect(await page.locator('#eval-source').getAttribute('data-source')).toBe('sglang');
    expect(await page.locator('#eval-source').isVisible()).toBe(false);
    expect(await page.locator('#eval-datasets th[data-field="configured"]').isVisible()).toBe(false);
    expect(await page.locator('#eval-datasets td[data-field="configured"]').count()).toBe(0);
    expect(await page.locator('#eval-summary').innerText()).toMatch(/^attempt 0001: passed · accept len /);
    expect(await page.locator('#eval-chart circle[data-source="sglang"]').count()).toBe(1);
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

/** The demo's datasets: budgets, and which are multi-turn (`turns: all`). */
const DEMO_DATASETS: { name: string; tokenBudget: number; turns?: 'all' }[] = [
  { name: 'B1_glaive', tokenBudget: 60_000 },
  { name: 'B2_magicoder', tokenBudget: 90_000 },
  { name: 'B3_ultrachat', tokenBudget: 80_000 },
  { name: 'B4_openmath', tokenBudget: 80_000 },
  { name: 'B5_sharegpt', tokenBudget: 50_000, turns: 'all' },
  { name: 'B6_writing', tokenBudget: 80_000 },
  { name: 'B7_reasoning', tokenBudget: 70_000 },
  { name: 'B8_sweagent', tokenBudget: 1_000_000, turns: 'all' },
];

/** What the demo's speculative simulator announces: 2.6 overall, three datasets of their own. */
const DEMO_SIM: SimulatorInfo = {
  imitates: '0.5.4',
  meanAcceptLength: 2.6,
  acceptance: [0.664, 0.664, 0.664],
  perDataset: { B2_magicoder: 3.1, B4_openmath: 2.9, B6_writing: 2.2 },
  draftOverhead: 0.25,
};

/** One phase's totals: `tokens` output tokens over `wallSec`, in `verify` verify steps (drafter). */
function phase(tokens: number, wallSec: number, verify = 0): PhaseTotals {
  return {
    ...emptyTotals(),
    requests: 4,
    promptTokens: 1_900,
    completionTokens: tokens,
    verifySteps: verify,
    correctDrafts: verify === 0 ? 0 : tokens - verify,
    proposedDrafts: verify * 3,
    draftCountAnswers: verify === 0 ? 0 : 4,
    histogram: verify === 0 ? [] : [40, 52, 61, Math.max(0, verify - 153)],
    wallSec,
  };
}

/**
 * The demo's eval of `attempt` against the two simulators (`measured`: against servers that made
 * no announcement, as SGLang); `scale` moves every acceptance length.
 */
function demoReport(attempt: string, scale: number, previous?: EvalReport, measured = false): EvalReport {
  const sim = (s: SimulatorInfo): SimulatorInfo | null => (measured ? null : s);
  const drafterUrl = 'http://127.0.0.1:41877';
  const baselineUrl = 'http://127.0.0.1:41879';
  const drafter = `/work/tokenmill/out/demo/train/${attempt}/checkpoints/step-60.pt`;
  const endpoints: DrafterEndpointInfo[] = [
    {
      url: drafterUrl,
      version: '0.5.4',
      modelPath: 'Qwen/Qwen3-8B',
      algorithm: 'EAGLE3',
      draftModelPath: drafter,
      numSteps: 3,
      eagleTopk: 1,
      numDraftTokens: 4,
      simulator: sim(DEMO_SIM),
    },
  ];
  const totals = DEMO_DATASETS.map((d, i) => {
    const accept = (DEMO_SIM.perDataset[d.name] ?? 2.6) * scale;
    const tokens = 480 + 7 * i;
    return {
      dataset: d.name,
      promptFile: `/work/tokenmill/out/demo/${d.name}/eval-prompts.jsonl`,
      prompts: 4,
      drafter: phase(
        tokens,
        (tokens / 1_000) * (1.25 / accept) * (d.name === 'B6_writing' ? 2 : 1),
        Math.round(tokens / accept),
      ),
      baseline: phase(tokens, tokens / 1_000),
    };
  });
  return buildReport(totals, {
    run: 'demo',
    attempt,
    drafter,
    measuredAt: `2026-12-02T06:0${Number(attempt)}:00.000Z`,
    durationSec: 14.2,
    endpoints,
    baseline: [
      {
        url: baselineUrl,
        version: '0.5.4',
        modelPath: 'Qwen/Qwen3-8B',
        simulator: sim({ ...DEMO_SIM, meanAcceptLength: null, acceptance: null, perDataset: {}, draftOverhead: null }),
      },
    ],
    settings: {
      concurrency: 8,
      maxNewTokens: 128,
      sampling: { temperature: 0 },
      maxPromptsPerDataset: 4,
      prompts: 'held-out',
    },
    skipped: [],
    ...(previous === undefined
      ? {}
      : { previous: { report: previous, file: `/work/tokenmill/out/demo/train/${previous.attempt}/eval.json` } }),
    thresholds: { maxAcceptDrop: 0.1 },
  });
}

describe.skipIf(!existsSync(CHROMIUM))("the demo's page: the eval and datasets cards hold their content", () => {
  let demo: Dashboard;
  let demoBrowser: Browser;
  const DEMO_TOKEN = 'layout-demo-token-0123456789';

  beforeAll(async () => {
    const demoConfig = loadConfig({
      object: {
        run: 'demo',
        redis: { url: redis.url, prefix: redis.prefix },
        sglang: { endpoints: ['http://127.0.0.1:41875'] },
        datasets: DEMO_DATASETS.map((d) => ({ ...d, prompts: `${d.name}.jsonl`, budget: 'strict' as const })),
        output: { dir: 'out' },
      },
      baseDir: tmp.dir,
    });
    const keys = new RunKeys(demoConfig.redis.prefix, demoConfig.run);
    const conn = redis.connection('client');
    for (const [i, d] of DEMO_DATASETS.entries()) {
      const tokens = Math.round(d.tokenBudget * (0.35 + 0.08 * i));
      await conn.hset(keys.stats(d.name), {
        status: 'in_progress',
        records: Math.round(tokens / 310),
        outputTokens: tokens,
        firstCommitMs: Date.now() - 60_000,
      });
      // Output tokens committed over the last minute: tok/s and an ETA range in the row.
      const bucket = Math.floor(Date.now() / 10_000);
      for (let b = 1; b <= 6; b++) await conn.hset(keys.rate(d.name), String(bucket - b), 900 + 150 * i * b);
      // A few failed prompts: the row gets a "Retry N failed" button beside "Pause".
      for (let f = 0; f < 3 + i; f++) await conn.hset(keys.failed(d.name), `${d.name}-${f}`, '{}');
    }
    const conversations: Record<
      string,
      { causes: Record<string, [number, string]>; ended: [string, number, string][] }
    > = {
      B5_sharegpt: {
        causes: { context: [14, 'sharegpt-0003417#s2'], error: [2, 'sharegpt-0000981'] },
        ended: [
          [
            'sharegpt-0003417#s2',
            9,
            "context: turn 9's prompt has 33,104 tokens, more than the context (32,768) allows",
          ],
          ['sharegpt-0000981', 3, 'error: turn 3: System message must be at the beginning of the conversation'],
        ],
      },
      B8_sweagent: {
        causes: {
          'tool-mismatch': [23, 'sweagent-django__django-11099#t5'],
          'tool-parse': [6, 'sweagent-sympy__sympy-20590#t3'],
          'tool-unknown': [4, 'sweagent-astropy__astropy-12907#t7'],
        },
        ended: [
          [
            'sweagent-django__django-11099#t5',
            5,
            'tool-mismatch: turn 5 called str_replace_editor(command=view, path=/testbed/django/db/models/query.py), the source called bash(command="grep -rn _filter_or_exclude")',
          ],
          ['sweagent-sympy__sympy-20590#t3', 3, 'tool-parse: turn 3: the arguments of call 2 (submit) are not JSON'],
          [
            'sweagent-astropy__astropy-12907#t7',
            7,
            'tool-unknown: turn 7 called run_tests, which the prompt does not offer',
          ],
        ],
      },
    };
    for (const [name, c] of Object.entries(conversations)) {
      const ended = Object.values(c.causes).reduce((n, [k]) => n + k, 0);
      await conn.hset(keys.stats(name), {
        conversationsStarted: 412,
        conversationsComplete: 301,
        conversationsEnded: ended,
        ...Object.fromEntries(
          Object.entries(c.causes).flatMap(([cause, [n, id]]) => [
            [`ended:${cause}`, n],
            [`ended-example:${cause}`, id],
          ]),
        ),
      });
      for (const [id, turn, reason] of c.ended) {
        const record = JSON.stringify({ id, kind: 'ended', turnsDone: turn - 1, turns: 12, turn, reason });
        await conn.hset(keys.conversations(name), id, record);
        await conn.lpush(`${keys.stats(name)}:ended`, record);
      }
    }
    const first = demoReport('0001', 0.93);
    const second = demoReport('0002', 1, first);
    for (const r of [first, second]) await conn.hset(new EvalKeys(keys).reports(), r.attempt ?? '', JSON.stringify(r));
    demo = await startDashboard({
      redis: redis.connection(),
      keys,
      config: demoConfig,
      host: '127.0.0.1',
      port: 0,
      token: DEMO_TOKEN,
      pollMs: 500,
      logger: quietLogger(),
    });
    demoBrowser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
    });
  }, 60_000);

  afterAll(async () => {
    await demoBrowser?.close();
    await demo?.stop();
  });

  /** What sticks out of a card: elements past its edges, cells whose content overflows them, misaligned rows. */
  interface CardFit {
    card: { left: number; right: number; width: number };
    outside: string[];
    overflowing: string[];
    tall: string[];
    misaligned: string[];
    scroll: number;
    width: number;
  }

  // In the page (a string: the test's TypeScript has no DOM types): every visible element of the
  // card inside its edges, every table cell holding its content, every body row's cells under the heads.
  const fitOf = (selector: string): string => `(() => {
    const card = document.querySelector(${JSON.stringify(selector)});
    const c = card.getBoundingClientRect();
    const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.dataset && e.dataset.field ? '[' + e.dataset.field + ']' : '') + (e.closest('tr') && e.closest('tr').dataset.dataset ? ' of ' + e.closest('tr').dataset.dataset : '');
    const outside = [];
    for (const e of card.querySelectorAll('*')) {
      const r = e.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.left < c.left - 0.5 || r.right > c.right + 0.5) outside.push(name(e) + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
    }
    const overflowing = [...card.querySelectorAll('td, th')]
      .filter((td) => td.scrollWidth > td.clientWidth + 1)
      .map((td) => name(td) + ' ' + td.scrollWidth + '>' + td.clientWidth);
    // A dataset's figures stay one row of text (its notes have a row of their own).
    const tall = [...card.querySelectorAll('tbody tr[data-dataset]')]
      .filter((tr) => tr.getBoundingClientRect().height > 60)
      .map((tr) => name(tr) + ' ' + Math.round(tr.getBoundingClientRect().height) + 'px');
    const misaligned = [];
    for (const table of card.querySelectorAll('table')) {
      const heads = [...table.querySelectorAll('thead th')].filter((h) => !h.hidden).map((h) => h.getBoundingClientRect());
      for (const tr of table.querySelectorAll('tbody tr')) {
        const cells = [...tr.children].filter((td) => !td.hidden).map((td) => td.getBoundingClientRect());
        // A dataset's notes row: one cell across every column.
        if (tr.dataset.notesOf !== undefined) {
          if (cells.length !== 1 || Math.abs(cells[0].left - heads[0].left) > 1 || Math.abs(cells[0].right - heads[heads.length - 1].right) > 1)
            misaligned.push('notes of ' + tr.dataset.notesOf);
        } else if (cells.length !== heads.length) misaligned.push(name(tr) + ': ' + cells.length + ' cells, ' + heads.length + ' heads');
        else cells.forEach((r, i) => {
          if (Math.abs(r.left - heads[i].left) > 1 || Math.abs(r.right - heads[i].right) > 1) misaligned.push(name(tr) + ' cell ' + i);
        });
      }
    }
    return { card: { left: c.left, right: c.right, width: c.width }, outside, overflowing, tall, misaligned, scroll: document.documentElement.scrollWidth, width: window.innerWidth };
  })()`;

  for (const width of [1280, 1024]) {
    it(`at ${width} px: both cards hold their content, every row under its heads; the eval says it is simulated`, async () => {
      const context = await demoBrowser.newContext({
        httpCredentials: { username: 'tokenmill', password: DEMO_TOKEN },
        viewport: { width, height: 900 },
      });
      const page = await context.newPage();
      await page.goto(demo.url);
      await page
        .locator('#datasets tr[data-notes-of="B8_sweagent"] [data-field="ended-by"]')
        .first()
        .waitFor({ timeout: 10_000 });
      await page.locator('#eval-datasets tr[data-dataset="overall"]').waitFor({ timeout: 10_000 });
      await page.locator('#eval-chart circle').nth(1).waitFor({ state: 'attached', timeout: 10_000 });

      const datasets = (await page.evaluate(fitOf('#datasets-card'))) as CardFit;
      const evaluation = (await page.evaluate(fitOf('#eval'))) as CardFit;
      for (const [what, fit] of [
        ['datasets', datasets],
        ['eval', evaluation],
      ] as const) {
        const why = `${what} at ${width}px: ${JSON.stringify(fit)}`;
        expect(fit.scroll, why).toBeLessThanOrEqual(fit.width);
        expect(fit.outside, why).toEqual([]);
        expect(fit.overflowing, why).toEqual([]);
        expect(fit.tall, why).toEqual([]);
        expect(fit.misaligned, why).toEqual([]);
      }
      expect(await page.locator('#datasets tbody tr[data-dataset]').count()).toBe(8);
      expect(await page.locator('#datasets tbody tr[data-notes-of]').count()).toBe(2);
      expect(await page.locator('#eval-datasets tbody tr').count()).toBe(9);

      // The figures say where they come from: the simulator's configured acceptance, per dataset too.
      const source = page.locator('#eval-source');
      expect(await source.getAttribute('data-source')).toBe('simulator');
      expect(await source.isVisible()).toBe(true);
      expect(await source.innerText()).toMatch(
        /^SIMULATED: the acceptance is the simulator's configured one \(accept len 2\.60; /,
      );
      expect(await page.locator('#eval-summary').innerText()).toContain('simulated');
      expect(
        await page.locator('#eval-datasets tr[data-dataset="B2_magicoder"] [data-field="configured"]').innerText(),
      ).toBe('3.10');
      expect(await page.locator('#eval-datasets th[data-field="configured"]').isVisible()).toBe(true);
      expect(await page.locator('#eval-chart circle[data-source="simulator"]').count()).toBe(2);
      await context.close();
    }, 30_000);
  }
});
