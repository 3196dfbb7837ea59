/**
 * Which prompts of a file an `evalHoldout` rule holds out (see eval-holdout.ts): the K prompts
 * with the smallest {@link evalHoldoutKey}, K by {@link evalHoldoutCount}. A pure reading of the
 * file: nothing is written.
 */
import { createHash } from 'node:crypto';
import { parsePromptLine, readRawLineChunks, type PromptFileIndex } from '../shared/index.js';

/**
 * Prompts held out of `prompts` by `evalHoldout`: an integer N ≥ 1 holds out min(N, prompts);
 * a fraction 0 < x < 1 holds out round(x × prompts) (half up), at least 1 (none of none).
 */
export function evalHoldoutCount(rule: number, prompts: number): number {
  if (prompts <= 0) return 0;
  if (Number.isInteger(rule)) return Math.min(rule, prompts);
  return Math.min(prompts, Math.max(1, Math.floor(rule * prompts + 0.5)));
}

/** A prompt's place in the split order: the first 16 hex digits of SHA-256 of `<dataset>\n<id>`. */
export function evalHoldoutKey(dataset: string, id: string): string {
  return createHash('sha256').update(`${dataset}\n${id}`).digest('hex').slice(0, 16);
}

/** SHA-256 of strings sorted, one a line: the same for the same set in any order. */
export function sortedHash(values: readonly string[]): string {
  const h = createHash('sha256');
  for (const v of [...values].sort()) h.update(`${v}\n`);
  return h.digest('hex');
}

/** A split computed from a prompt file. */
export interface ComputedSplit {
  /** Valid prompts with distinct ids in the file. */
  prompts: number;
  /** Held-out ids, in file order. */
  ids: string[];
  /** Their lines (1-based), in file order. */
  lines: number[];
  /** {@link sortedHash} of the ids, and of the SHA-256 of each held-out line's text. */
  idsSha256: string;
  linesSha256: string;
}

interface Entry {
  key: string;
  id: string;
  line: number;
  lineHash: string;
}

/** Whether `a` comes after `b` in the split order (key, then id). */
function after(a: Entry, b: Entry): boolean {
  return a.key === b.key ? a.id > b.id : a.key > b.key;
}

/** A max-heap of at most `cap` entries: what stays are the `cap` smallest offered. */
class SmallestK {
  readonly items: Entry[] = [];
  constructor(private readonly cap: number) {}

  /** Whether an entry of this key (and id) would be kept now. */
  wants(key: string, id: string): boolean {
    const top = this.items[0];
    return this.items.length < this.cap || (top !== undefined && after(top, { key, id, line: 0, lineHash: '' }));
  }

  offer(e: Entry): void {
    if (this.cap <= 0) return;
    if (this.items.length < this.cap) {
      this.items.push(e);
      this.up(this.items.length - 1);
    } else if (this.wants(e.key, e.id)) {
      this.items[0] = e;
      this.down(0);
    }
  }

  /** Drops the largest until `n` remain. */
  trim(n: number): void {
    while (this.items.length > n) {
      const last = this.items.pop() as Entry;
      if (this.items.length === 0) break;
      this.items[0] = last;
      this.down(0);
    }
  }

  private up(i: number): void {
    const a = this.items;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!after(a[i] as Entry, a[p] as Entry)) break;
      [a[i], a[p]] = [a[p] as Entry, a[i] as Entry];
      i = p;
    }
  }

  private down(i: number): void {
    const a = this.items;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < a.length && after(a[l] as Entry, a[m] as Entry)) m = l;
      if (r < a.length && after(a[r] as Entry, a[m] as Entry)) m = r;
      if (m === i) return;
      [a[i], a[m]] = [a[m] as Entry, a[i] as Entry];
      i = m;
    }
  }
}

/**
 * The split `rule` gives `file` now: one read of the file, every line parsed as the producer
 * parses it (`index.parse`), the first valid line of each id counted; a heap keeps the smallest
 * keys (at most the count the file's non-blank lines would give, since prompts ≤ lines).
 */
export async function selectEvalSplit(input: {
  dataset: string;
  file: string;
  rule: number;
  index: PromptFileIndex;
}): Promise<ComputedSplit> {
  const { dataset, file, rule, index } = input;
  const heap = new SmallestK(evalHoldoutCount(rule, index.lines));
  const tracker = index.tracker();
  let prompts = 0;
  for await (const chunk of readRawLineChunks(file)) {
    for (const { line, text } of chunk) {
      if (text === undefined) continue;
      const parsed = parsePromptLine(text, file, line, index.parse);
      if (!parsed.ok || tracker.firstLineOf(parsed.record.id, line) !== undefined) continue;
      prompts += 1;
      const id = parsed.record.id;
      const key = evalHoldoutKey(dataset, id);
      if (!heap.wants(key, id)) continue;
      heap.offer({ key, id, line, lineHash: createHash('sha256').update(text).digest('hex') });
    }
  }
  heap.trim(evalHoldoutCount(rule, prompts));
  const chosen = [...heap.items].sort((a, b) => a.line - b.line);
  return {
    prompts,
    ids: chosen.map((e) => e.id),
    lines: chosen.map((e) => e.line),
    idsSha256: sortedHash(chosen.map((e) => e.id)),
    linesSha256: sortedHash(chosen.map((e) => e.lineHash)),
  };
}
