// The front door's links stay right: every relative link in README.md and docs/*.md names a file
// or folder of the repository, and every #anchor names a heading of the Markdown page it points
// to (GitHub's heading ids). Links with a scheme (https:, mailto:) are not followed.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The pages checked: README.md and every Markdown file directly in docs/. */
function pagesChecked(): string[] {
  const docs = readdirSync(path.join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => path.join('docs', f));
  return ['README.md', ...docs.sort()];
}

/** The text outside fenced code blocks, line by line (fenced lines become empty, so numbers stay). */
function proseLines(markdown: string): string[] {
  let fence: string | undefined;
  return markdown.split('\n').map((line) => {
    const open = /^\s*(```+|~~~+)/.exec(line);
    if (fence === undefined && open) {
      fence = open[1]!.slice(0, 3);
      return '';
    }
    if (fence !== undefined) {
      if (line.trim().startsWith(fence)) fence = undefined;
      return '';
    }
    return line;
  });
}

/** GitHub's id of a heading: lower case, punctuation dropped, spaces to hyphens (github-slugger). */
export function headingSlug(heading: string): string {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // links and images: their text
    .replace(/<[^>]+>/g, '') // inline HTML tags
    .replace(/`/g, '')
    .replace(/\*\*|__/g, '');
  return text
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
    .replace(/ /g, '-');
}

/** The anchors a Markdown page offers: its headings' ids (repeats get -1, -2, …) and explicit `id`/`name` attributes. */
export function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of proseLines(markdown)) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      const base = headingSlug(heading[1]!);
      const n = seen.get(base) ?? 0;
      seen.set(base, n + 1);
      anchors.add(n === 0 ? base : `${base}-${n}`);
    }
    for (const m of line.matchAll(/<a\s+[^>]*(?:id|name)="([^"]+)"/g)) anchors.add(m[1]!);
  }
  return anchors;
}

export interface Link {
  line: number;
  target: string;
}

/** Inline links and images of a page, outside code blocks and code spans. */
export function linksOf(markdown: string): Link[] {
  const links: Link[] = [];
  proseLines(markdown).forEach((text, i) => {
    const line = text.replace(/`[^`]*`/g, '');
    for (const m of line.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      links.push({ line: i + 1, target: m[1]! });
    }
    for (const m of line.matchAll(/<a\s+[^>]*href="([^"]+)"/g)) links.push({ line: i + 1, target: m[1]! });
  });
  return links;
}

/** Why a link of `page` (a path relative to `root`) is broken, or undefined when it resolves. */
export function brokenReason(root: string, page: string, target: string): string | undefined {
  if (/^[a-z][a-z0-9+.-]*:/i.test(target)) return undefined; // https:, mailto:, …
  const hash = target.indexOf('#');
  const rawPath = hash === -1 ? target : target.slice(0, hash);
  const anchor = hash === -1 ? undefined : decodeURIComponent(target.slice(hash + 1));
  const filePath = decodeURIComponent(rawPath.split('?')[0]!);
  if (filePath.startsWith('/')) return 'absolute path: use a path relative to the page';
  const resolved = filePath === '' ? path.join(root, page) : path.resolve(root, path.dirname(page), filePath);
  const relative = path.relative(root, resolved);
  if (relative.startsWith('..') || path.isAbsolute(relative)) return `${filePath} is outside the repository`;
  if (!existsSync(resolved)) return `${relative} does not exist`;
  if (anchor === undefined || anchor === '') return undefined;
  if (statSync(resolved).isDirectory() || !resolved.endsWith('.md'))
    return `#${anchor} on ${relative}, which is not a Markdown page`;
  if (!anchorsOf(readFileSync(resolved, 'utf8')).has(anchor)) return `${relative} has no heading #${anchor}`;
  return undefined;
}

/** Every broken link of `page`, as `page:line: target (why)`. */
export function brokenLinks(root: string, page: string): string[] {
  const text = readFileSync(path.join(root, page), 'utf8');
  const broken: string[] = [];
  for (const { line, target } of linksOf(text)) {
    const why = brokenReason(root, page, target);
    if (why !== undefined) broken.push(`${page}:${line}: ${target} (${why})`);
  }
  return broken;
}

describe('docs links', () => {
  const pages = pagesChecked();

  it('checks the README and the docs pages', () => {
    expect(pages).toContain('README.md');
    expect(pages).toContain(path.join('docs', 'design.md'));
    expect(pages.length).toBeGreaterThan(5);
  });

  it.each(pages)('every relative link and anchor in %s resolves', (page) => {
    expect(brokenLinks(ROOT, page)).toEqual([]);
  });

  it('the README links to every docs page', () => {
    const readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    const linked = new Set(linksOf(readme).map((l) => l.target.split('#')[0]));
    const missing = pages.filter((p) => p !== 'README.md' && !linked.has(p.split(path.sep).join('/')));
    expect(missing).toEqual([]);
  });
});

describe('the link checker', () => {
  const page = [
    '# Title',
    '',
    '## Token budgets: `budget: reserve | strict`',
    '## Train stage (merge → train)',
    '## Repeated',
    '## Repeated',
  ].join('\n');

  it('makes GitHub heading ids', () => {
    const anchors = anchorsOf(page);
    expect([...anchors]).toEqual([
      'title',
      'token-budgets-budget-reserve--strict',
      'train-stage-merge--train',
      'repeated',
      'repeated-1',
    ]);
  });

  it('finds inline links and images, but not links in code', () => {
    const text = [
      'See [a](a.md), ![img](b.png) and [c](c.md#x "title").',
      '`[not](a link)`',
      '```',
      '[nor](this.md)',
      '```',
    ].join('\n');
    expect(linksOf(text).map((l) => l.target)).toEqual(['a.md', 'b.png', 'c.md#x']);
  });

  it('reports a missing file, a missing anchor and a path outside the repository', () => {
    expect(brokenReason(ROOT, 'README.md', 'docs/no-such-page.md')).toMatch(/does not exist/);
    expect(brokenReason(ROOT, 'README.md', 'docs/design.md#no-such-heading')).toMatch(/no heading #no-such-heading/);
    expect(brokenReason(ROOT, 'README.md', '#no-such-heading')).toMatch(/no heading/);
    expect(brokenReason(ROOT, 'docs/design.md', '../../outside.md')).toMatch(/outside the repository/);
    expect(brokenReason(ROOT, 'README.md', '/docs/design.md')).toMatch(/absolute path/);
  });

  it('accepts a file, a folder, an anchor and an external link', () => {
    expect(brokenReason(ROOT, 'README.md', 'docs/design.md')).toBeUndefined();
    expect(brokenReason(ROOT, 'docs/design.md', '../src/shared/')).toBeUndefined();
    expect(brokenReason(ROOT, 'docs/design.md', '#invariants')).toBeUndefined();
    expect(brokenReason(ROOT, 'README.md', 'https://github.com/sgl-project/sglang')).toBeUndefined();
  });
});
