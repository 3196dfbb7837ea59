// What "the same content" means for the eval split (src/shared/prompts/eval-content.ts), and
// which sample ids are a held-out prompt's.
import { describe, expect, it } from 'vitest';
import { isSampleOf, promptContentKey } from '../../src/shared/index.js';

describe('promptContentKey', () => {
  const key = (...messages: { role: 'system' | 'user' | 'assistant'; content: string }[]): string =>
    promptContentKey(messages);

  it('is the user turns, white space and Unicode normalized; system prompts do not count', () => {
    const base = key({ role: 'user', content: 'Caf\u00e9 au lait?' });
    expect(key({ role: 'user', content: '  Cafe\u0301   au\n\tlait? ' })).toBe(base);
    expect(key({ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Café au lait?' })).toBe(base);
    expect(base).toMatch(/^[0-9a-f]{16}$/);
  });

  it('differs for other words, case, or other turns', () => {
    const base = key({ role: 'user', content: 'Café au lait?' });
    expect(key({ role: 'user', content: 'café au lait?' })).not.toBe(base);
    expect(
      key(
        { role: 'user', content: 'Café au lait?' },
        { role: 'assistant', content: 'Yes.' },
        { role: 'user', content: 'More?' },
      ),
    ).not.toBe(base);
  });
});

describe('isSampleOf', () => {
  const ids = new Set(['p-1', 'q#2']);
  it('matches the id, its samples and its turns, nothing else', () => {
    expect(isSampleOf(ids, 'p-1')).toBe(true);
    expect(isSampleOf(ids, 'p-1#s2')).toBe(true);
    expect(isSampleOf(ids, 'p-1#t3')).toBe(true);
    expect(isSampleOf(ids, 'q#2#s1')).toBe(true);
    expect(isSampleOf(ids, 'p-10')).toBe(false);
    expect(isSampleOf(ids, 'q')).toBe(false);
  });
});
