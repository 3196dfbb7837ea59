import { AppError } from '../../shared/index.js';

/** Values of the command's placeholders. */
export interface CommandValues {
  dataset: string;
  output: string;
  /** The checkpoint resumed from; null when starting from scratch. */
  checkpoint: string | null;
  /** GPUs assigned (their count is `{gpus}`). */
  gpus: readonly number[];
  /** A split step's groups: `{target_gpus}` and `{drafter_gpus}`, their indices joined by commas. */
  groups?: { target: readonly number[]; drafter: readonly number[] } | null;
}

const PLACEHOLDER = /\{(dataset|output|checkpoint|gpus|target_gpus|drafter_gpus)\}/g;

/**
 * The argv to run: `command` (+ `resumeArgs` when resuming) with `{dataset}`, `{output}`,
 * `{checkpoint}`, `{gpus}` and a split step's `{target_gpus}` / `{drafter_gpus}` replaced. Resuming is refused when no argument carries
 * `{checkpoint}`: the command would silently start from scratch.
 */
export function buildArgv(command: readonly string[], resumeArgs: readonly string[], values: CommandValues): string[] {
  const argv = values.checkpoint === null ? [...command] : [...command, ...resumeArgs];
  if (values.checkpoint !== null && !argv.some((a) => a.includes('{checkpoint}'))) {
    throw new AppError(
      'resume: neither train.command nor train.resumeArgs has "{checkpoint}", so the command would not know what to resume from; add it (e.g. resumeArgs: [--resume, "{checkpoint}"])',
    );
  }
  return argv.map((a) =>
    a.replace(PLACEHOLDER, (_m, name: string) => {
      if (name === 'dataset') return values.dataset;
      if (name === 'output') return values.output;
      if (name === 'checkpoint') return values.checkpoint ?? '';
      if (name === 'gpus') return String(values.gpus.length);
      const groups = values.groups ?? null;
      if (groups === null)
        throw new AppError(
          `{${name}}: only a step with a target group and a drafter group (gpus: { target: N, drafter: M }) has it`,
        );
      return (name === 'target_gpus' ? groups.target : groups.drafter).join(',');
    }),
  );
}
