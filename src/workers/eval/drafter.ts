/**
 * Which drafter an evaluation is of, and where its report goes: `--checkpoint PATH`, or an
 * attempt's final output (`--attempt N`, default the latest attempt). An attempt's final output
 * is its `checkpoints/` folder, or with `train.steps` the last step's `output/` folder; the drafter
 * is that folder when it holds a model (`config.json`), else its newest checkpoint folder, else
 * (a trainer that saves one file per checkpoint) its newest checkpoint file.
 */
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { AppError, exists, type Config } from '../../shared/index.js';
import { listAttempts, listCheckpoints, trainDir } from '../train/index.js';
import { type EvalReport, parseReport } from './report.js';

/** The drafter evaluated. */
export interface DrafterChoice {
  /** The checkpoint folder the endpoints must serve. */
  path: string;
  /** The attempt folder name, or null for `--checkpoint`. */
  attempt: string | null;
  /** The attempt folder, or null. */
  attemptDir: string | null;
  /** How it was chosen, for messages: `attempt 0002's final output`, `--checkpoint`. */
  what: string;
}

async function isDir(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isDirectory();
  } catch {
    return false;
  }
}

/** `7` → `0007`; a name already padded stays. */
export function attemptName(n: string): string {
  if (!/^\d+$/.test(n))
    throw new AppError(`eval: --attempt ${JSON.stringify(n)} is not an attempt number (e.g. 2 or 0002)`);
  return n.padStart(4, '0');
}

/** The attempt folder's final output folder: the last step's `output/` with `train.steps`, else `checkpoints/`. */
export function finalOutputDir(config: Pick<Config, 'train'>, attemptDir: string): string {
  const last = config.train?.steps?.at(-1);
  return last === undefined ? path.join(attemptDir, 'checkpoints') : path.join(attemptDir, last.name, 'output');
}

/**
 * The drafter in a final output folder: the folder itself when it holds `config.json`, else its
 * newest checkpoint folder, else its newest checkpoint file (`step-000060.pt`).
 */
export async function drafterIn(outputDir: string): Promise<string | undefined> {
  if (await exists(path.join(outputDir, 'config.json'))) return outputDir;
  const entries = await listCheckpoints(outputDir);
  const dirs: string[] = [];
  for (const e of entries) if (await isDir(e)) dirs.push(e);
  return dirs.at(-1) ?? entries.filter((e) => /\d/.test(path.basename(e))).at(-1);
}

/**
 * The drafter to evaluate: `checkpoint` as given (it must exist here), else the final output of
 * attempt `attempt` (default: the latest). Throws an AppError naming what is missing.
 */
export async function chooseDrafter(
  config: Pick<Config, 'train'>,
  runDir: string,
  options: { attempt?: string | undefined; checkpoint?: string | undefined },
): Promise<DrafterChoice> {
  if (options.attempt !== undefined && options.checkpoint !== undefined)
    throw new AppError('eval: choose one of --attempt or --checkpoint, not both');
  if (options.checkpoint !== undefined) {
    const p = path.resolve(options.checkpoint);
    if (!(await exists(p))) throw new AppError(`eval: --checkpoint ${p} does not exist`);
    return { path: p, attempt: null, attemptDir: null, what: '--checkpoint' };
  }
  const attempts = await listAttempts(runDir);
  const name = options.attempt === undefined ? attempts.at(-1) : attemptName(options.attempt);
  if (name === undefined)
    throw new AppError(
      `eval: no training attempt under ${trainDir(runDir)} to evaluate; train one, or give --checkpoint <drafter folder>`,
    );
  if (!attempts.includes(name))
    throw new AppError(
      `eval: no attempt ${name} under ${trainDir(runDir)} (attempts: ${attempts.length === 0 ? 'none' : attempts.join(', ')})`,
    );
  const attemptDir = path.join(trainDir(runDir), name);
  const out = finalOutputDir(config, attemptDir);
  const drafter = await drafterIn(out);
  if (drafter === undefined)
    throw new AppError(
      `eval: attempt ${name} left no drafter in ${out} (no config.json there, no checkpoint in it); give --checkpoint <drafter folder>`,
    );
  return { path: drafter, attempt: name, attemptDir, what: `attempt ${name}'s final output` };
}

/** `<attempt>/eval.json`. */
export function evalReportPath(attemptDir: string): string {
  return path.join(attemptDir, 'eval.json');
}

/**
 * The report to compare with: the `eval.json` of the newest attempt before `attempt` that has one
 * (for `--checkpoint`, of the newest attempt). An unreadable one is skipped and said in `notes`.
 */
export async function previousReport(
  runDir: string,
  attempt: string | null,
): Promise<{ found?: { report: EvalReport; file: string }; notes: string[] }> {
  const notes: string[] = [];
  const attempts = await listAttempts(runDir);
  const before = attempt === null ? attempts : attempts.filter((a) => Number(a) < Number(attempt));
  for (const a of before.reverse()) {
    const file = evalReportPath(path.join(trainDir(runDir), a));
    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch {
      continue;
    }
    const parsed = parseReport(text, file);
    if (typeof parsed === 'string') {
      notes.push(`${parsed}; not compared with`);
      continue;
    }
    return { found: { report: parsed, file }, notes };
  }
  return { notes };
}
