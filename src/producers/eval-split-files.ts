/**
 * The files of an eval split (eval-holdout.ts): its manifest, the temp file a split is written
 * to and published from (a hard link that never replaces another process' split), and the
 * temps a killed process left.
 */
import { createHash } from 'node:crypto';
import { link, readFile, rename } from 'node:fs/promises';
import { dirname } from 'node:path';
import { exists, fsyncDir, isErrno, writeFileAtomic, type Logger } from '../shared/index.js';

/** `eval-prompts.json`: how the split was made. */
export interface EvalManifest {
  dataset: string;
  /** The prompt file the split was taken from (absolute). */
  sourceFile: string;
  /** That file when the split was made (or last found to give the same split). */
  source: { bytes: number; mtimeMs: number; prompts: number };
  /** Prompts held out (lines of eval-prompts.jsonl). */
  count: number;
  rule: { evalHoldout: number; count: string; select: string };
  /** SHA-256 of the held-out ids, sorted, one a line. */
  idsSha256: string;
  /** SHA-256 of the SHA-256s of the held-out lines, sorted: a held-out prompt edited changes it. */
  linesSha256: string;
  /** When the split was written (ISO 8601). */
  created: string;
}

export async function readManifest(file: string): Promise<EvalManifest | undefined> {
  try {
    const m = JSON.parse(await readFile(file, 'utf8')) as EvalManifest;
    return typeof m.rule?.evalHoldout === 'number' && typeof m.source?.bytes === 'number' ? m : undefined;
  } catch {
    return undefined; // missing or not ours: the split is checked against the prompt file instead
  }
}

export async function writeManifest(file: string, manifest: EvalManifest): Promise<void> {
  await writeFileAtomic(file, `${JSON.stringify(manifest, null, 2)}\n`);
}

/**
 * Puts `tmp` in place as `file` unless `file` exists: false when another process published
 * first. A hard link, which fails rather than replace; a rename where links are not supported.
 */
export async function publish(tmp: string, file: string): Promise<boolean> {
  try {
    await link(tmp, file);
  } catch (e: unknown) {
    if (isErrno(e, 'EEXIST')) return false;
    if (!isErrno(e, 'EPERM') && !isErrno(e, 'ENOTSUP') && !isErrno(e, 'EXDEV')) throw e;
    if (await exists(file)) return false;
    await rename(tmp, file);
  }
  await fsyncDir(dirname(file));
  return true;
}

/** Warnings given by this process (one per split file and version of what it was checked against). */
const warned = new Set<string>();

/** Logs `message` once per `key` in this process. */
export function warnOnce(log: Logger, key: string, fields: Record<string, unknown>, message: string): void {
  if (warned.has(key)) return;
  warned.add(key);
  log.warn(fields, message);
}

/** SHA-256 of `text`, hex. */
export function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}
