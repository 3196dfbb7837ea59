import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { configReferenceMarkdown } from '../../src/shared/config/reference.js';

describe('README config reference', () => {
  it('is the table generated from the schema (run `npx tsx scripts/gen-config-docs.ts --write README.md`)', () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    const start = readme.indexOf('<!-- config-reference:start -->');
    const end = readme.indexOf('<!-- config-reference:end -->');
    expect(start).toBeGreaterThan(0);
    expect(readme.slice(start, end)).toContain(configReferenceMarkdown().trim());
  });
});
