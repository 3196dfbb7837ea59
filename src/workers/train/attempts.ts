import { mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { AppError, exists } from '../../shared/index.js';

/**
 * Attempt folders: every training start, from scratch or resumed, gets its own folder
 * `<runDir>/train/<attempt>/` (`0001`, `0002`, …) with `train.log`, `checkpoints/` and
 * `attempt.json`. Nothing here ever deletes a checkpoint.
 */

/** `<runDir>/train`. */
export function trainDir(runDir: string): string {
  return path.join(runDir, 'train');
}

const ATTEMPT_NAME = /^\d{4,}$/;

/** What `attempt.json` records. */
export interface AttemptRecord {
  attempt: string;
  jobId: string;
  mode: 'from-scratch' | 'resume';
  /** The checkpoint this attempt resumed from. */
  resumedFrom: string | null;
  startedAt: string;
}

/** One attempt and the checkpoints it holds (oldest first). */
export interface AttemptListing {
  attempt: string;
  dir: string;
  checkpoints: string[];
  record: AttemptRecord | null;
}

/** Attempt folder names under `<runDir>/train`, oldest first. */
export async function listAttempts(runDir: string): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(trainDir(runDir));
  } catch (e: unknown) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
  return names.filter((n) => ATTEMPT_NAME.test(n)).sort((a, b) => Number(a) - Number(b));
}

/**
 * The checkpoints in a folder, oldest first: entries ordered by the last number in their name
 * (`step-40`, `checkpoint-690`, `epoch_2_step_1200`), then by modification time.
 */
export async function listCheckpoints(dir: string): Promise<string[]> {
  let names: string[];
  try {
    names = (await readdir(dir)).filter((n) => !n.startsWith('.'));
  } catch (e: unknown) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
  const withKeys = await Promise.all(
    names.map(async (n) => {
      const nums = n.match(/\d+/g);
      return {
        path: path.join(dir, n),
        num: nums === null ? -1 : Number(nums.at(-1)),
        mtime: (await stat(path.join(dir, n))).mtimeMs,
      };
    }),
  );
  withKeys.sort((a, b) => a.num - b.num || a.mtime - b.mtime || a.path.localeCompare(b.path));
  return withKeys.map((c) => c.path);
}

async function readRecord(dir: string): Promise<AttemptRecord | null> {
  try {
    return JSON.parse(await readFile(path.join(dir, 'attempt.json'), 'utf8')) as AttemptRecord;
  } catch {
    return null;
  }
}

/** Every attempt with its checkpoints, oldest first. */
export async function describeAttempts(runDir: string): Promise<AttemptListing[]> {
  const out: AttemptListing[] = [];
  for (const a of await listAttempts(runDir)) {
    const dir = path.join(trainDir(runDir), a);
    out.push({
      attempt: a,
      dir,
      checkpoints: await listCheckpoints(path.join(dir, 'checkpoints')),
      record: await readRecord(dir),
    });
  }
  return out;
}

/** `attempt 0001: checkpoints step-20, step-40; attempt 0002: no checkpoint` */
function listingText(list: readonly AttemptListing[]): string {
  return list
    .map(
      (a) =>
        `attempt ${a.attempt} (${a.dir}): ${a.checkpoints.length === 0 ? 'no checkpoint' : `checkpoints ${a.checkpoints.map((c) => path.basename(c)).join(', ')}`}`,
    )
    .join('; ');
}

/**
 * The checkpoint a resume starts from: the one given (it must exist), else the newest of the
 * latest attempt — or, when that attempt left none, the checkpoint it had itself resumed from
 * (same lineage). Never a checkpoint of an earlier, unrelated attempt.
 *
 * @throws AppError naming every attempt and its checkpoints when there is nothing to resume.
 */
export async function resolveResumeCheckpoint(runDir: string, given?: string): Promise<string> {
  if (given !== undefined) {
    if (await exists(given)) return given;
    const list = await describeAttempts(runDir);
    throw new AppError(
      `resume: checkpoint ${given} does not exist. What exists: ${list.length === 0 ? `no attempt under ${trainDir(runDir)}` : listingText(list)}`,
    );
  }
  const list = await describeAttempts(runDir);
  const latest = list.at(-1);
  if (latest === undefined)
    throw new AppError(
      `resume: nothing to resume — no training attempt under ${trainDir(runDir)}; start one with --from-scratch`,
    );
  const newest = latest.checkpoints.at(-1);
  if (newest !== undefined) return newest;
  const inherited = latest.record?.resumedFrom;
  if (inherited !== null && inherited !== undefined && (await exists(inherited))) return inherited;
  throw new AppError(
    `resume: the latest attempt ${latest.attempt} has no checkpoint. What exists: ${listingText(list)}. ` +
      'Pass one with --resume <checkpoint>, or start again with --from-scratch',
  );
}

/** A new attempt folder (with `checkpoints/`), numbered after the last one; never reuses one. */
export async function createAttempt(
  runDir: string,
  record: Omit<AttemptRecord, 'attempt' | 'startedAt'>,
): Promise<{ attempt: string; dir: string; checkpoints: string; log: string }> {
  await mkdir(trainDir(runDir), { recursive: true });
  for (;;) {
    const last = (await listAttempts(runDir)).at(-1);
    const attempt = String((last === undefined ? 0 : Number(last)) + 1).padStart(4, '0');
    const dir = path.join(trainDir(runDir), attempt);
    try {
      await mkdir(dir); // not recursive: EEXIST when another worker took this number first
    } catch (e: unknown) {
      if ((e as NodeJS.ErrnoException).code === 'EEXIST') continue;
      throw e;
    }
    await mkdir(path.join(dir, 'checkpoints'));
    const full: AttemptRecord = { ...record, attempt, startedAt: new Date().toISOString() };
    await writeFile(path.join(dir, 'attempt.json'), `${JSON.stringify(full, null, 2)}\n`);
    return { attempt, dir, checkpoints: path.join(dir, 'checkpoints'), log: path.join(dir, 'train.log') };
  }
}
