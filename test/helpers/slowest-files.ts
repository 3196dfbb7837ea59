// A vitest reporter that prints the ten slowest test files at the end of a run, each with the
// seconds it took (import, setup and its tests and hooks), so that a file that grew slow shows up
// in every run's output. Added after the default reporter in vitest*.config.ts.
import type { Reporter, TestModule } from 'vitest/node';

/** The seconds one test file took: its setup, import and collection, then its tests and hooks. */
export function fileSeconds(module: TestModule): number {
  const d = module.diagnostic();
  return (d.environmentSetupDuration + d.prepareDuration + d.setupDuration + d.collectDuration + d.duration) / 1000;
}

/** The lines printed for `modules`: a header, then the `count` slowest, slowest first. */
export function slowestFilesReport(modules: readonly { file: string; seconds: number }[], count = 10): string[] {
  if (modules.length === 0) return [];
  const slowest = [...modules].sort((a, b) => b.seconds - a.seconds).slice(0, count);
  const width = Math.max(...slowest.map((m) => m.seconds.toFixed(1).length));
  return [
    `Slowest ${slowest.length === 1 ? 'file' : `${slowest.length} files`}:`,
    ...slowest.map((m) => `  ${m.seconds.toFixed(1).padStart(width)} s  ${m.file}`),
  ];
}

export default class SlowestFilesReporter implements Reporter {
  constructor(private readonly count = 10) {}

  onTestRunEnd(testModules: readonly TestModule[]): void {
    const lines = slowestFilesReport(
      testModules.map((m) => ({ file: m.relativeModuleId, seconds: fileSeconds(m) })),
      this.count,
    );
    if (lines.length > 0) process.stdout.write(`\n${lines.join('\n')}\n`);
  }
}
