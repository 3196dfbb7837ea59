// tiktoken rank files for the tests, made from a rank set shipped in an installed package
// (js-tiktoken's o200k_base) rather than downloaded: `<base64 token> <rank>` lines, as
// tiktoken's own `.tiktoken` files and Kimi's `tiktoken.model` are.
import { cp, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';

import { REPO_ROOT } from './python.js';

/** The committed part of the Kimi-like tokenizer folder (no rank file). */
export const KIMI_LIKE_FIXTURE = path.join(REPO_ROOT, 'test', 'fixtures', 'tokenizers', 'kimi-like');

/** o200k_base's rank count: where the Kimi-like fixture's special ids start. */
export const O200K_RANK_COUNT = 199_998;

interface JsTiktokenRanks {
  pat_str: string;
  special_tokens: Record<string, number>;
  bpe_ranks: string;
}

/** js-tiktoken's o200k_base: the special tokens and the rank lines. */
export function o200kRanks(): { specialTokens: Record<string, number>; lines: string } {
  const require = createRequire(import.meta.url);
  const mod = require('js-tiktoken/ranks/o200k_base') as JsTiktokenRanks | { default: JsTiktokenRanks };
  const ranks = 'default' in mod ? mod.default : mod;
  // js-tiktoken's compact form: lines of "<marker> <first rank> <base64> <base64> ...".
  const out: string[] = [];
  for (const line of ranks.bpe_ranks.split('\n')) {
    if (line === '') continue;
    const [, offset, ...tokens] = line.split(' ');
    const first = Number(offset);
    tokens.forEach((t, i) => out.push(`${t} ${first + i}`));
  }
  return { specialTokens: ranks.special_tokens, lines: `${out.join('\n')}\n` };
}

/** Writes o200k_base as a `.tiktoken` rank file at `file`. */
export async function writeO200kRankFile(file: string): Promise<string> {
  await writeFile(file, o200kRanks().lines);
  return file;
}

/** A Kimi-like tokenizer folder in `dir`: the fixture's files plus `tiktoken.model` (o200k ranks). */
export async function makeKimiLikeTokenizer(dir: string): Promise<string> {
  await cp(KIMI_LIKE_FIXTURE, dir, { recursive: true });
  await writeO200kRankFile(path.join(dir, 'tiktoken.model'));
  return dir;
}
