// The pipeline page in real headless Chromium during a run against the SGLang simulator: it
// lists every dataset and updates without a reload; pausing one from the page stops the
// simulator receiving its requests within a second while the others go on; resume; a failed
// prompt shows in Bull Board's failed tab with its reason, and Bull Board's Retry gets it
// committed. The drafter's evaluations: a chart of the acceptance length per attempt (SVG drawn
// by the page from /api data) and the latest report's warnings and failed checks. A screenshot of
// the page is kept under test-artifacts/.
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGeneration, type GenerationHandle } from '../../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../../src/cli/run-context.js';
import { startDashboard, type Dashboard } from '../../src/dashboard/server.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import { EvalKeys, loadConfig, type Config } from '../../src/shared/index.js';
import { writeEvalStatus } from '../../src/workers/index.js';
import { useHarness, type TempDir } from '../helpers/fixture.js';
import { repoRoot, waitFor, writePrompts } from '../helpers/pipeline.js';
import { INJECTED_500_MESSAGE, startPromptFaultProxy, type PromptFaultProxy } from '../helpers/prompt-fault-proxy.js';
import { quietLogger, type TestRedis } from '../helpers/redis.js';

const CHROMIUM = '/usr/bin/chromium';
const TOKEN = 'browser-test-token-0123456789';
const DATASETS = ['alpha', 'beta', 'gamma'] as const;
/** answered 500 until its attempts are spent: its batch ends as a failed job */
const BAD = 'alpha-3';
const ARTIFACTS = join(repoRoot, 'test-artifacts');

let redis: TestRedis;
let sim: SimulatorHandle;
let proxy: PromptFaultProxy;
let tmp: TempDir;
let config: Config;
let ctx: RunContext;
let run: GenerationHandle;
let dashboard: Dashboard;
let browser: Browser;
let page: Page;

/** Generation requests the simulator has received for a dataset (rids are `<dataset>/<id>#…`). */
function received(dataset: string, sinceMs = 0): number {
  return sim.stats().requests.filter((r) => r.rid.startsWith(`${dataset}/`) && r.receivedAtMs >= sinceMs).length;
}

async function records(dataset: string): Promise<number> {
  return Number(await ctx.redis.hget(ctx.keys.stats(dataset), 'records'));
}

const cell = (dataset: string, field: string) =>
  page.locator(`#datasets tr[data-dataset="${dataset}"] td[data-field="${field}"]`);

describe.skipIf(!existsSync(CHROMIUM))('the pipeline page in a browser, during a run', () => {
  ({ redis, sim, tmp } = useHarness({
    redis: true,
    tmp: true,
    // ~150 ms a request: the run goes on for minutes unless stopped, so it is still running
    // through every step below.
    sim: { timeScale: 10, maxRunningRequests: 32, seed: 3, outputLength: { distribution: 'fixed', mean: 100 } },
  }));

  beforeAll(async () => {
    proxy = await startPromptFaultProxy(sim.url);
    proxy.failing.add(BAD);
    for (const d of DATASETS) writePrompts(tmp.dir, d, 1_200);
    config = loadConfig({
      object: {
        run: 'browser',
        redis: { url: redis.url, prefix: redis.prefix },
        sglang: { endpoints: [proxy.url], concurrency: 9, maxAttempts: 2, requestTimeoutMs: 30_000 },
        datasets: DATASETS.map((name) => ({
          name,
          prompts: `${name}.jsonl`,
          tokenBudget: 10_000_000,
          maxNewTokens: 256,
          batchSize: 8,
        })),
        output: { dir: 'out' },
        workers: { shutdownGraceMs: 1_000 },
      },
      baseDir: tmp.dir,
    });
    ctx = await openRunContextFor(config);
    dashboard = await startDashboard({
      redis: ctx.redis,
      keys: ctx.keys,
      config,
      host: '127.0.0.1',
      port: 0,
      token: TOKEN,
      pollMs: 500,
      logger: quietLogger(),
    });
    run = await startGeneration(ctx, { produce: true, infer: true });
    // Stopped by afterAll long before it would finish; what it was waiting on then does not matter.
    run.finished.catch(() => undefined);
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
    });
    const context = await browser.newContext({
      httpCredentials: { username: 'tokenmill', password: TOKEN },
      viewport: { width: 1280, height: 900 },
    });
    page = await context.newPage();
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    await run?.stop();
    await dashboard?.stop();
    await ctx?.close();
    await proxy?.close();
  });

  it('lists every dataset, the endpoint and the workers, and updates without a reload', async () => {
    let navigations = 0;
    page.on('framenavigated', (f) => {
      if (f === page.mainFrame()) navigations += 1;
    });
    const res = await page.goto(dashboard.url);
    expect(res?.status()).toBe(200);
    for (const d of DATASETS) await cell(d, 'records').waitFor({ timeout: 10_000 });
    expect(await page.locator('#datasets tbody tr').count()).toBe(DATASETS.length);
    await page.locator('#connection[data-state="live"]').waitFor({ timeout: 5_000 });
    await page.locator(`#endpoints tr[data-endpoint="${proxy.url}"]`).waitFor({ timeout: 10_000 });
    await page.locator('#workers tr[data-role="inference"]').waitFor({ timeout: 10_000 });
    await page.locator('#workers tr[data-role="producer"]').waitFor({ timeout: 10_000 });
    expect(await page.locator('#phases li').evaluateAll((li) => li.map((l) => l.getAttribute('data-phase')))).toEqual([
      'prepare',
      'generate',
      'tokenize',
      'merge',
      'train',
      'eval',
    ]);
    expect(await page.locator('a#queues-link').getAttribute('href')).toBe('queues');

    // The figures move while the page stays the same document.
    await page.evaluate(() => Object.assign(globalThis, { sameDocument: true }));
    const first = await cell('beta', 'records').textContent();
    await waitFor(
      async () => (await cell('beta', 'records').textContent()) !== first,
      "beta's records to change on the page",
      10_000,
      100,
    );
    expect(await page.evaluate(() => (globalThis as { sameDocument?: boolean }).sameDocument)).toBe(true);
    expect(navigations).toBe(1);
    // What the page shows is what Redis holds (within one update).
    const shown = Number((await cell('alpha', 'records').textContent())?.replace(/,/g, ''));
    expect(shown).toBeGreaterThan(0);
    expect(shown).toBeLessThanOrEqual(await records('alpha'));
  }, 30_000);

  it('pausing a dataset from the page stops its requests within a second while the others go on; resume', async () => {
    const pauseDone = page.waitForResponse(
      (r) => r.url().endsWith('/api/datasets/gamma/pause') && r.request().method() === 'POST',
    );
    await page.locator('button[data-action="pause"][data-dataset="gamma"]').click();
    expect((await pauseDone).status()).toBe(200);
    const pausedAt = Date.now();
    await page.locator('#datasets tr[data-dataset="gamma"][data-status="paused"]').waitFor({ timeout: 5_000 });
    expect(await cell('gamma', 'paused').textContent()).toBe('yes');

    // From a second after the pause on: no request of gamma reaches the server, its records stay
    // flat, and alpha and beta keep going.
    await new Promise((r) => setTimeout(r, 1_000 - (Date.now() - pausedAt)));
    const quietFrom = Date.now();
    const gammaRecords = await records('gamma');
    const others = { alpha: received('alpha'), beta: received('beta') };
    await new Promise((r) => setTimeout(r, 2_500));
    expect(received('gamma', quietFrom)).toBe(0);
    expect(await records('gamma')).toBe(gammaRecords);
    expect(received('alpha')).toBeGreaterThan(others.alpha);
    expect(received('beta')).toBeGreaterThan(others.beta);

    const resumeDone = page.waitForResponse((r) => r.url().endsWith('/api/datasets/gamma/resume'));
    await page.locator('button[data-action="resume"][data-dataset="gamma"]').click();
    expect((await resumeDone).status()).toBe(200);
    const resumedAt = Date.now();
    await waitFor(() => received('gamma', resumedAt) > 0, "gamma's requests after resume", 5_000, 50);
    await waitFor(async () => (await records('gamma')) > gammaRecords, 'gamma committing again', 5_000, 50);
    await page.locator('#datasets tr[data-dataset="gamma"][data-status="in_progress"]').waitFor({ timeout: 5_000 });

    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, 'dashboard.png'), fullPage: true });
  }, 30_000);

  it("draws each attempt's acceptance length and shows the latest report's warnings and failed check", async () => {
    const section = (
      acceptLength: number,
      speedup: number,
      delta: { acceptLength: number; speedup: number } | null,
    ) => ({
      prompts: 4,
      drafter: {
        acceptLength,
        acceptRate: (acceptLength - 1) / 3,
        tokensPerSec: 300 * speedup,
        failures: 0,
        requests: 4,
      },
      baseline: { tokensPerSec: 300, failures: 0, requests: 4 },
      speedup,
      delta:
        delta === null
          ? null
          : { ...delta, acceptLengthChange: delta.acceptLength / (acceptLength - delta.acceptLength) },
    });
    const report = (attempt: string, acceptLength: number, speedup: number, previous: number | null) => {
      const delta = previous === null ? null : { acceptLength: acceptLength - previous, speedup: speedup - 2 };
      const slower = speedup < 1;
      return {
        version: 1,
        run: 'browser',
        attempt,
        drafter: `/out/browser/train/${attempt}/checkpoints/step-20`,
        measuredAt: `2026-01-0${Number(attempt)}T10:00:00.000Z`,
        durationSec: 3,
        endpoints: [],
        baseline: [],
        settings: {
          concurrency: 4,
          maxNewTokens: 64,
          sampling: { temperature: 0 },
          maxPromptsPerDataset: 4,
          prompts: 'held-out',
        },
        datasets: [{ dataset: 'alpha', promptFile: 'eval-prompts.jsonl', ...section(acceptLength, speedup, delta) }],
        overall: section(acceptLength, speedup, delta),
        skipped: [],
        previous: previous === null ? null : { attempt: '0001', file: 'eval.json', measuredAt: null, comparable: true },
        warnings: slower
          ? [
              `dataset alpha: the drafter makes decoding slower: ${(300 * speedup).toFixed(1)} vs 300.0 tok/s (speed-up ${speedup.toFixed(2)}x)`,
            ]
          : [],
        failed: slower
          ? [
              {
                check: 'minSpeedup',
                value: speedup,
                threshold: 1.1,
                message: `speed-up ${speedup.toFixed(2)}x is below eval.minSpeedup 1.1`,
              },
            ]
          : [],
        ok: !slower,
      };
    };
    await ctx.redis.hset(new EvalKeys(ctx.keys).reports(), {
      '0001': JSON.stringify(report('0001', 2.9, 2.1, null)),
      '0002': JSON.stringify(report('0002', 1.4, 0.8, 2.9)),
    });
    await writeEvalStatus(
      ctx.redis,
      ctx.keys,
      'browser-train-2-eval',
      { state: 'failed', attempt: '0002', reason: 'below eval.minSpeedup' },
      'failed',
      true,
    );

    await page.goto(dashboard.url);
    const points = page.locator('#eval-chart circle');
    await waitFor(async () => (await points.count()) === 2, 'two points on the eval chart', 10_000, 100);
    expect(
      await points.evaluateAll((c) =>
        c.map((x) => [x.getAttribute('data-attempt'), x.getAttribute('data-accept-length'), x.getAttribute('data-ok')]),
      ),
    ).toEqual([
      ['0001', '2.9', 'true'],
      ['0002', '1.4', 'false'],
    ]);
    // Drawn to scale: the better attempt's point is higher (smaller y).
    const ys = await points.evaluateAll((c) => c.map((x) => Number(x.getAttribute('cy'))));
    expect(ys[0]).toBeLessThan(ys[1] ?? 0);
    expect(await page.locator('#eval-chart polyline').count()).toBe(1);
    expect(await page.locator('#eval-warnings li').allTextContents()).toEqual([
      'FAILED: speed-up 0.80x is below eval.minSpeedup 1.1',
      'WARNING: dataset alpha: the drafter makes decoding slower: 240.0 vs 300.0 tok/s (speed-up 0.80x)',
    ]);
    expect(await page.locator('#eval-summary').textContent()).toMatch(
      /^attempt 0002: FAILED · accept len 1\.40 · speed-up 0\.80x · compared with attempt 0001/,
    );
    const row = page.locator('#eval-datasets tr[data-dataset="alpha"] td');
    expect(await row.allTextContents()).toEqual(['alpha', '1.40', '-1.50', '0.80x', '-1.20']);
    expect(await page.locator('#phases li[data-phase="eval"]').getAttribute('data-status')).toBe('failed');
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.locator('section#eval').screenshot({ path: join(ARTIFACTS, 'dashboard-eval.png') });
  }, 30_000);

  it("shows the failed prompt in Bull Board's failed tab with its reason; Retry there gets it committed", async () => {
    const isDone = async (): Promise<boolean> => (await ctx.redis.sismember(ctx.keys.done('alpha'), BAD)) === 1;
    await waitFor(
      async () => (await ctx.redis.hexists(ctx.keys.failed('alpha'), BAD)) === 1,
      `${BAD} failed`,
      20_000,
      100,
    );
    await page.goto(new URL('/queues/queue/generate-alpha?status=failed', dashboard.url).href);
    const card = page.locator('li, article, div').filter({ hasText: INJECTED_500_MESSAGE }).last();
    await card.waitFor({ timeout: 15_000 });
    const text = (await page.locator('body').textContent()) ?? '';
    expect(text).toContain(`(id ${BAD}), HTTP 500, 2 attempt(s)`);
    expect(await isDone()).toBe(false);

    // The server is fixed; Bull Board's own Retry button on the job sends it again.
    proxy.failing.clear();
    const before = proxy.requests(BAD);
    const retried = page.waitForResponse(
      (r) =>
        /\/queues\/api\/queues\/generate-alpha\/[^/]+\/retry(\/failed)?$/.test(r.url()) &&
        r.request().method() === 'PUT',
      { timeout: 10_000 },
    );
    // The job card's first icon button is Retry; Bull Board asks to confirm.
    await page.locator('span[data-base-ui-tooltip-trigger] > button').first().click();
    const dialog = page.getByRole('alertdialog').or(page.getByRole('dialog'));
    await dialog.getByText('retry this job').waitFor({ timeout: 5_000 });
    await dialog.getByRole('button', { name: 'Confirm' }).click();
    expect((await retried).ok()).toBe(true);
    await waitFor(isDone, `${BAD} committed after Retry`, 20_000, 100);
    expect(proxy.requests(BAD) - before).toBe(1);
    expect(await ctx.redis.hexists(ctx.keys.failed('alpha'), BAD)).toBe(0);
  }, 45_000);
});
