/**
 * What a prepared prompt file was made from: its sources (each file's size and mtime), the
 * settings that shape it, the tokenizer when prompts are measured with it, and, with
 * `dedupeAcross`, the datasets before it. Stored next to the prompt file, it lets a second
 * `prepare` of unchanged sources keep the file as it is.
 */
import { createHash } from 'node:crypto';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { writeFileAtomic, type PromptSource } from '../../shared/index.js';
import type { WrittenFile } from './prompt-file-writer.js';
import type { PrepareCounts } from './prepare-report.js';

/** Bumped when the same inputs would give a different prompt file (2: records keep their tool schemas). */
export const PREPARE_FORMAT_VERSION = 2;

/** The tokenizer settings a length filter depends on. */
export interface TokenizerIdentity {
  path: string;
  kind: string;
  pattern?: string | undefined;
  preset?: string | undefined;
}

/** Everything the prompt file depends on. */
export interface FingerprintInputs {
  version: number;
  dataset: string;
  source: PromptSource;
  maxPromptTokens: number | null;
  dedupeAcross: boolean;
  files: { path: string; size: number; mtimeMs: number }[];
  tokenizer: (TokenizerIdentity & { files: { name: string; size: number; mtimeMs: number }[] }) | null;
  /** Fingerprints of the datasets prepared before this one, whose prompts it must not repeat. */
  after: string[];
  /** `datasets[].turns: all`: whole conversations are kept (absent for `last`, so older fingerprints still match). */
  turns?: 'all';
  /** `datasets[].chatTemplateKwargs`, which the length filter renders with (absent when none). */
  templateKwargs?: Record<string, unknown>;
  /** `turns: all` with a known context length: what the conversations that would not fit whole are counted against. */
  contextCheck?: { contextLength: number; maxNewTokens: number };
}

/** The fingerprint file: `<prompts>.fingerprint.json`. */
export interface StoredFingerprint {
  fingerprint: string;
  prompts: Omit<WrittenFile, 'file'>;
  counts: PrepareCounts;
  ms: number;
  inputs: FingerprintInputs;
}

/** Where the fingerprint of a prompt file is kept. */
export function fingerprintFileOf(promptsFile: string): string {
  return `${promptsFile}.fingerprint.json`;
}

/** The inputs of a dataset's prompt file, from its opened source's files. */
export async function fingerprintInputs(params: {
  dataset: string;
  source: PromptSource;
  files: readonly string[];
  maxPromptTokens: number | undefined;
  dedupeAcross: boolean;
  tokenizer: TokenizerIdentity | undefined;
  after: readonly string[];
  turns: 'last' | 'all';
  templateKwargs?: Record<string, unknown> | undefined;
  contextCheck?: { contextLength: number; maxNewTokens: number } | undefined;
}): Promise<FingerprintInputs> {
  const files = [];
  for (const f of params.files) {
    const st = await stat(f);
    files.push({ path: f, size: st.size, mtimeMs: st.mtimeMs });
  }
  let tokenizer: FingerprintInputs['tokenizer'] = null;
  const contextCheck = params.turns === 'all' ? params.contextCheck : undefined;
  if ((params.maxPromptTokens !== undefined || contextCheck !== undefined) && params.tokenizer !== undefined) {
    const t = params.tokenizer;
    const entries = [];
    for (const name of (await readdir(t.path).catch(() => [] as string[])).sort()) {
      const st = await stat(join(t.path, name)).catch(() => undefined);
      if (st?.isFile() === true) entries.push({ name, size: st.size, mtimeMs: st.mtimeMs });
    }
    tokenizer = {
      path: t.path,
      kind: t.kind,
      ...(t.pattern === undefined ? {} : { pattern: t.pattern }),
      ...(t.preset === undefined ? {} : { preset: t.preset }),
      files: entries,
    };
  }
  return {
    version: PREPARE_FORMAT_VERSION,
    dataset: params.dataset,
    source: params.source,
    maxPromptTokens: params.maxPromptTokens ?? null,
    dedupeAcross: params.dedupeAcross,
    files,
    tokenizer,
    after: params.dedupeAcross ? [...params.after] : [],
    ...(params.turns === 'all' ? { turns: 'all' as const } : {}),
    ...(params.templateKwargs === undefined ? {} : { templateKwargs: params.templateKwargs }),
    ...(contextCheck === undefined ? {} : { contextCheck }),
  };
}

/** The fingerprint of `inputs`: the SHA-256 of their JSON, keys sorted. */
export function fingerprintOf(inputs: FingerprintInputs): string {
  return createHash('sha256').update(stableJson(inputs)).digest('hex');
}

function stableJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stableJson).join(',')}]`;
  if (typeof value === 'object' && value !== null) {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stableJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/** The stored fingerprint of a prompt file, or undefined when there is none (or it is unreadable). */
export async function readStoredFingerprint(promptsFile: string): Promise<StoredFingerprint | undefined> {
  try {
    const parsed = JSON.parse(await readFile(fingerprintFileOf(promptsFile), 'utf8')) as StoredFingerprint;
    return typeof parsed.fingerprint === 'string' && typeof parsed.prompts?.sha256 === 'string' ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/** Whether the prompt file on disk is still the one `stored` describes (size, mtime, inode). */
export async function promptFileMatches(promptsFile: string, stored: StoredFingerprint): Promise<boolean> {
  try {
    const st = await stat(promptsFile);
    return st.size === stored.prompts.bytes && st.mtimeMs === stored.prompts.mtimeMs && st.ino === stored.prompts.ino;
  } catch {
    return false;
  }
}

/** Writes the fingerprint file of a prompt file just committed. */
export async function writeStoredFingerprint(
  written: WrittenFile,
  stored: Omit<StoredFingerprint, 'prompts'>,
): Promise<void> {
  const { file, ...prompts } = written;
  await writeFileAtomic(fingerprintFileOf(file), `${JSON.stringify({ ...stored, prompts }, null, 2)}\n`);
}
