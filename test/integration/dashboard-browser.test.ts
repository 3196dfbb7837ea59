// The pipeline page in real headless Chromium during a run against the SGLang simulator: it
// lists every dataset and updates without a reload; pausing one from the page stops the
// simulator receiving its requests within a second while the others go on; resume; a failed
// prompt shows in Bull Board's failed tab with its reason, and Bull Board's Retry gets it
// committed. A screenshot of the page is kept under test-artifacts/.
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGeneration, type GenerationHandle } from '../../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../../src/cli/run-context.js';
import { startDashboard, type Dashboard } from '../../src/dashboard/server.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import { loadConfig, type Config } from '../../src/shared/index.js';
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
