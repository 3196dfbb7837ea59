// After `tokenmill demo`, every command works on its run with the config it leaves beside its
// output (`<out>/demo/tokenmill.yaml`): one demo as a real child process (`--json`), then the
// commands it prints, run as printed, each as a child process: `status` sees the demo's counters
// in the demo's embedded Redis, `export` writes the merged dataset's rows and the SpecForge
// conversations, `train --resume` continues the demo's training. The demo's `--json` phases say
// what ran: train completed, with its attempt, when the trainer environment exists, and the eval
// step after it, on two simulators its eval.server starts: the demo ends with the eval table, and
// `train --resume` on its config trains a second attempt whose table is compared with the first;
// `eval -c` measures the latest attempt again with the same servers.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';
import { demoTrainerPython } from '../../src/cli/commands/demo-train.js';
import { EXPORT_FORMATS } from '../../src/cli/commands/export.js';
import { useHarness } from '../helpers/fixture.js';
import { repoRoot, spawnCli } from '../helpers/pipeline.js';

interface Phase {
  name: string;
  status: string;
  configured: boolean;
  detail: string;
}

interface DatasetCounts {
  name: string;
  records: number;
  outputTokens: number;
  skipped: number;
  failed: number;
  status: string;
}

interface Next {
  status: string;
  postprocess: string;
  export: { jsonl: string; specforge: string; speculators: string };
  train: string | null;
  eval: string | null;
}

interface EvalSectionJson {
  prompts: number;
  drafter: { acceptLength: number | null };
  speedup: number | null;
}

interface DemoJson {
  eval: {
    report: {
      attempt: string;
      datasets: (EvalSectionJson & { dataset: string })[];
      overall: EvalSectionJson;
      source?: string;
      simulated?: { meanAcceptLength: number | null; datasets: Record<string, number> } | null;
    } | null;
    attempts: { attempt: string; acceptLength: number | null }[];
  } | null;
  phases: Phase[];
  datasets: DatasetCounts[];
  train: { state: string; attempt: string | null } | null;
  postprocess: { status: string; report: { rows: number } | null };
  config: string;
  next: Next;
}

/** The arguments of a printed `tokenmill …` command line (words split as a shell does; '…' quoted). */
function argsOf(command: string): string[] {
  const words: string[] = [];
  let word: string | null = null;
  for (let i = 0; i < command.length; i += 1) {
    const ch = command[i] ?? '';
    if (ch === "'") {
      const end = command.indexOf("'", i + 1);
      word = (word ?? '') + command.slice(i + 1, end);
      i = end;
    } else if (ch === '\\') {
      word = (word ?? '') + (command[i + 1] ?? '');
      i += 1;
    } else if (ch === ' ') {
      if (word !== null) words.push(word);
      word = null;
    } else word = (word ?? '') + ch;
  }
  if (word !== null) words.push(word);
  expect(words[0], command).toBe('tokenmill');
  return words.slice(1);
}

/** Runs a printed command as a child process; its exit code and output. */
async function runPrinted(
  command: string,
  extra: string[] = [],
): Promise<{ code: number | string; out: string; stdout: string }> {
  const child = spawnCli([...argsOf(command), ...extra]);
  const code = await child.exited;
  return { code, out: child.output(), stdout: child.stdout() };
}

function lines(file: string): string[] {
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '');
}

const { tmp } = useHarness({ tmp: 'tm-demo-config-', cli: true });
const trains = demoTrainerPython(repoRoot) !== null;
let demo: DemoJson;
let demoOutput: string;
let yamlPath: string;

describe('tokenmill demo leaves a config every command works with', () => {
  beforeAll(async () => {
    const child = spawnCli(['demo', '--out', tmp.dir, '--json']);
    const code = await child.exited;
    expect(code, child.output().slice(-4_000)).toBe(0);
    const out = child.stdout().trim().split('\n');
    expect(out, 'one JSON object on stdout').toHaveLength(1);
    demo = JSON.parse(out[0] ?? '') as DemoJson;
    demoOutput = child.output();
    yamlPath = path.join(tmp.dir, 'demo', 'tokenmill.yaml');
  }, 300_000);

  it('names its config and the commands on it; the phases say what ran', () => {
    expect(demo.config).toBe(yamlPath);
    expect(existsSync(yamlPath)).toBe(true);
    const text = readFileSync(yamlPath, 'utf8');
    expect(text).toMatch(/^# The config `tokenmill demo` ran with/);
    expect(text).toContain(`#   ${demo.next.status}\n`);
    expect(text).toMatch(/# http:\/\/127\.0\.0\.1:\d+ was the demo's built-in SGLang simulator/);
    expect(text).toMatch(/#   tokenmill sim --port \d+ /);

    expect(demo.next.status).toBe(`tokenmill status -c ${yamlPath}`);
    expect(demo.next.export.jsonl).toBe(
      `tokenmill export -c ${yamlPath} --format jsonl --out ${path.join(tmp.dir, 'demo', 'export', 'rows.jsonl')}`,
    );
    expect(demo.next.export.specforge).toContain(`-c ${yamlPath} --format specforge --out `);
    expect(demo.next.export.speculators).toContain(`-c ${yamlPath} --format speculators --out `);

    for (const name of ['prepare', 'generate', 'tokenize', 'merge'])
      expect(demo.phases.find((p) => p.name === name)?.status, name).toBe('completed');
    const train = demo.phases.find((p) => p.name === 'train');
    if (trains) {
      expect(demo.next.train).toBe(`tokenmill train -c ${yamlPath} --resume`);
      expect(train).toMatchObject({ status: 'completed', configured: true });
      expect(train?.detail).toMatch(/^attempt 0001, completed/);
      expect(demo.train).toMatchObject({ state: 'completed', attempt: '0001' });
    } else {
      expect(demo.next.train).toBeNull();
      expect(train).toMatchObject({ status: 'pending', configured: false, detail: 'not configured' });
    }
  });

  it.runIf(trains)('ends with the eval of the attempt: its table, the eval phase and the report in --json', () => {
    const phase = demo.phases.find((p) => p.name === 'eval');
    expect(phase).toMatchObject({ status: 'completed', configured: true });
    // Against the demo's simulator: its configured acceptance, and said to be.
    expect(phase?.detail).toMatch(/^attempt 0001 \(SIMULATED\): accept len \d\.\d\d, speed-up \d\.\d\dx$/);
    const report = demo.eval?.report;
    expect(report?.attempt).toBe('0001');
    expect(report).toMatchObject({ source: 'simulator', simulated: { meanAcceptLength: 2.6 } });
    expect(report?.simulated?.datasets).toMatchObject({ B2_magicoder: 3.1, B4_openmath: 2.9, B6_writing: 2.2 });
    expect(report?.datasets.map((d) => d.dataset)).toEqual(demo.datasets.map((d) => d.name));
    for (const d of report?.datasets ?? []) {
      expect(d.prompts, d.dataset).toBe(4);
      // The simulated drafter: 2.2 to 3.1 tokens per verify step by dataset, faster than the target alone.
      expect(d.drafter.acceptLength, d.dataset).toBeGreaterThan(2);
      expect(d.speedup, d.dataset).toBeGreaterThan(1);
    }
    expect(demo.eval?.attempts.map((a) => a.attempt)).toEqual(['0001']);
    // With --json the tables go to stderr: the eval table per dataset, then overall.
    expect(demoOutput).toMatch(/^eval: attempt 0001, drafter .*\/train\/0001\/checkpoints\/step-000060\.pt$/m);
    expect(demoOutput).toMatch(
      /^ {2}SIMULATED: the acceptance is the simulator's configured one \(accept len 2\.60; /m,
    );
    expect(demoOutput).toMatch(/ draft tokens \(tokenmill sim, imitating SGLang 0\.5\.4\)$/m);
    expect(demoOutput).toMatch(
      /^dataset +prompts +accept len +configured +accept rate +drafter tok\/s +baseline tok\/s +speed-up +failed$/m,
    );
    expect(demoOutput).toMatch(/^B2_magicoder +4 +\d\.\d\d +3\.10 +0\.\d{3} +[\d.]+ +[\d.]+ +\d\.\d\dx +0$/m);
    expect(demoOutput).toMatch(/^overall +32 +\d\.\d\d /m);
    expect(demo.next.eval).toBe(`tokenmill eval -c ${yamlPath}`);
  });

  it('status -c sees the counters of the demo in its embedded Redis', async () => {
    const printed = await runPrinted(demo.next.status);
    expect(printed.code, printed.out.slice(-2_000)).toBe(0);
    expect(printed.stdout).toContain('B1_glaive');

    const status = await runPrinted(demo.next.status, ['--json']);
    expect(status.code, status.out.slice(-2_000)).toBe(0);
    const after = JSON.parse(status.stdout.trim()) as DemoJson;
    const counts = (d: DatasetCounts): DatasetCounts => ({
      name: d.name,
      records: d.records,
      outputTokens: d.outputTokens,
      skipped: d.skipped,
      failed: d.failed,
      status: d.status,
    });
    expect(after.datasets.map(counts)).toEqual(demo.datasets.map(counts));
    expect(after.datasets.reduce((a, d) => a + d.records, 0)).toBeGreaterThan(0);
    expect(after.phases.map((p) => [p.name, p.status])).toEqual(demo.phases.map((p) => [p.name, p.status]));
  }, 60_000);

  it('export -c --format jsonl writes the merged dataset’s rows; --format specforge its conversations', async () => {
    const rows = demo.postprocess.report?.rows ?? 0;
    expect(rows).toBeGreaterThan(0);
    const jsonl = await runPrinted(demo.next.export.jsonl);
    expect(jsonl.code, jsonl.out.slice(-2_000)).toBe(0);
    const rowsFile = argsOf(demo.next.export.jsonl).at(-1) ?? '';
    expect(lines(rowsFile)).toHaveLength(rows);

    const specforge = await runPrinted(demo.next.export.specforge);
    expect(specforge.code, specforge.out.slice(-2_000)).toBe(0);
    const conversations = lines(argsOf(demo.next.export.specforge).at(-1) ?? '');
    expect(conversations.length).toBeGreaterThan(0);
    for (const l of conversations) expect(() => JSON.parse(l) as unknown).not.toThrow();

    if ((EXPORT_FORMATS as readonly string[]).includes('speculators')) {
      const speculators = await runPrinted(demo.next.export.speculators);
      expect(speculators.code, speculators.out.slice(-2_000)).toBe(0);
      expect(existsSync(path.join(argsOf(demo.next.export.speculators).at(-1) ?? '', 'dataset_info.json'))).toBe(true);
    }
  }, 120_000);

  it('postprocess -c runs on the demo run (nothing new to merge)', async () => {
    const printed = await runPrinted(demo.next.postprocess);
    expect(printed.code, printed.out.slice(-2_000)).toBe(0);
  }, 60_000);

  it.runIf(trains)(
    'train -c --resume continues the demo’s training from its checkpoint',
    async () => {
      const printed = await runPrinted(demo.next.train ?? '');
      expect(printed.code, printed.out.slice(-3_000)).toBe(0);
      expect(printed.out).toMatch(/train: completed, attempt 0002 \(resume from .*step-000060\.pt\)/);
      // The eval step after it, compared with attempt 0001: the same simulated drafter, so the
      // acceptance length is the same (the draws are a function of the seed and the request).
      expect(printed.stdout).toMatch(/^eval: attempt 0002, drafter .*step-000120\.pt$/m);
      expect(printed.stdout).toContain('  compared with attempt 0001\n');
      expect(printed.stdout).toMatch(
        // The configured column has no overall figure: three datasets have their own.
        /^overall +32 +\d\.\d\d +- +0\.\d{3} +[\d.]+ +[\d.]+ +\d\.\d\dx +\+0\.00 +[+-]\d\.\d\d +0$/m,
      );
      const status = await runPrinted(demo.next.status, ['--json']);
      const after = JSON.parse(status.stdout.trim()) as DemoJson;
      expect(after.train).toMatchObject({ state: 'completed', attempt: '0002' });
      expect(after.phases.find((p) => p.name === 'train')?.status).toBe('completed');
      expect(after.eval?.attempts.map((a) => a.attempt)).toEqual(['0001', '0002']);
      const text = await runPrinted(demo.next.status);
      expect(text.stdout).toContain('eval of attempt 0002: passed (simulated ');
      expect(text.stdout).toContain(
        "\n  SIMULATED: the acceptance is the simulator's configured one (accept len 2.60; ",
      );
      expect(text.stdout).toMatch(
        /^ {2}overall +accept len \d\.\d\d \(\+0\.00\), speed-up \d\.\d\dx \([+-]\d\.\d\d\)$/m,
      );

      // `eval -c` as printed: the latest attempt again, on servers its eval.server starts.
      const again = await runPrinted(demo.next.eval ?? '');
      expect(again.code, again.out.slice(-3_000)).toBe(0);
      expect(again.stdout).toMatch(/^eval: attempt 0002, drafter /m);
      expect(again.out).toContain('tokenmill: eval: servers stopped');
    },
    180_000,
  );
});
