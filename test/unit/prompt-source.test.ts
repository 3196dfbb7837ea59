import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { contentSampleId, parsePromptLine, readPromptFile, type PromptLine } from '../../src/shared/index.js';
import { useTempDir } from '../helpers/temp.js';

describe('prompt records', () => {
  it('reads the three shapes into messages ending with the user turn to answer', () => {
    const m = parsePromptLine(
      '{"id":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"Q"}]}',
      'f',
      1,
    );
    expect(m).toEqual({
      ok: true,
      record: {
        id: 'a',
        line: 1,
        messages: [
          { role: 'system', content: 'S' },
          { role: 'user', content: 'Q' },
        ],
      },
    });
    const p = parsePromptLine('{"id":7,"prompt":"hello"}', 'f', 2);
    expect(p).toEqual({ ok: true, record: { id: '7', line: 2, messages: [{ role: 'user', content: 'hello' }] } });
    // SpecForge / ShareGPT: the conversation up to its last user turn; the answer after it is dropped.
    const c = parsePromptLine(
      JSON.stringify({
        id: 'c',
        conversations: [
          { from: 'human', value: 'one' },
          { from: 'gpt', value: 'two' },
          { role: 'user', content: 'three' },
          { role: 'assistant', content: 'old answer' },
        ],
      }),
      'f',
      3,
    );
    expect(c.ok && c.record.messages).toEqual([
      { role: 'user', content: 'one' },
      { role: 'assistant', content: 'two' },
      { role: 'user', content: 'three' },
    ]);
  });

  it('gives a record without an id a stable content hash, the same on any line', () => {
    const a = parsePromptLine('{"prompt":"same text"}', 'f', 1);
    const b = parsePromptLine('{"prompt":"same text"}', 'g', 99);
    const c = parsePromptLine('{"prompt":"other text"}', 'f', 2);
    expect(a.ok && b.ok && c.ok).toBe(true);
    if (a.ok && b.ok && c.ok) {
      expect(a.record.id).toBe(b.record.id);
      expect(a.record.id).not.toBe(c.record.id);
      expect(a.record.id).toBe(contentSampleId([{ role: 'user', content: 'same text' }]));
      expect(a.record.id).toMatch(/^h:[0-9a-f]{16}$/);
    }
  });

  it.each([
    ['{not json', /invalid JSON/],
    ['[1,2]', /expected a JSON object/],
    ['{"id":"x"}', /expected one of "messages", "conversations" or "prompt"/],
    ['{"id":"x","prompt":"   "}', /empty/],
    [
      '{"id":"x","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}',
      /last message must be a user turn/,
    ],
    ['{"id":"x","messages":[{"role":"robot","content":"q"}]}', /messages\[0\]\.role/],
    ['{"id":"","prompt":"q"}', /"id" must be a non-empty string/],
    ['{"id":"x","conversations":[{"role":"assistant","content":"a"}]}', /no user turn/],
  ])('rejects %s with a reason', (text, reason) => {
    const r = parsePromptLine(text, 'data/x.jsonl', 12);
    expect(r.ok).toBe(false);
    if (!r.ok) {
      expect(r.reject.file).toBe('data/x.jsonl');
      expect(r.reject.line).toBe(12);
      expect(r.reject.reason).toMatch(reason);
    }
  });

  it('streams a file: blank lines skipped, line numbers kept, a repeated id rejected with the first line', async () => {
    const dir = useTempDir('tm-ps-');
    const file = path.join(dir, 'p.jsonl');
    writeFileSync(
      file,
      ['{"id":"a","prompt":"1"}', '', '{"id":"b","prompt":"2"}', 'oops', '{"id":"a","prompt":"3"}'].join('\n'),
    );
    const out: PromptLine[] = [];
    for await (const l of readPromptFile(file)) out.push(l);
    expect(out.map((l) => (l.ok ? `ok:${l.record.id}@${l.record.line}` : `bad@${l.reject.line}`))).toEqual([
      'ok:a@1',
      'ok:b@3',
      'bad@4',
      'bad@5',
    ]);
    const dup = out[3];
    expect(dup !== undefined && !dup.ok && dup.reject.reason).toBe('duplicate id "a" (first on line 1)');
  });
});
