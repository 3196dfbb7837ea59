import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { configReferenceMarkdown } from '../../src/shared/config/reference.js';

const START = '<!-- config-reference:start -->';
const END = '<!-- config-reference:end -->';

describe('docs/config.md config reference', () => {
  it('is the table generated from the schema (run `npx tsx scripts/gen-config-docs.ts --write docs/config.md`)', () => {
    const page = readFileSync(new URL('../../docs/config.md', import.meta.url), 'utf8');
    const start = page.indexOf(START);
    const end = page.indexOf(END);
    expect(start).toBeGreaterThan(0);
    expect(end).toBeGreaterThan(start);
    expect(page.slice(start + START.length, end).trim()).toBe(configReferenceMarkdown().trim());
  });

  it('is the only copy: the README links to it instead of holding the table', () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    expect(readme).not.toContain(START);
    expect(readme).toContain('docs/config.md');
  });
});
