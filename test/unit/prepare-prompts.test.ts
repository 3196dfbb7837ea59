// The pure parts of `prepare`: a row's turns to a prompt, ids, hashes, the hash set.
import { describe, expect, it } from 'vitest';
import { contentSampleId, parsePromptLine } from '../../src/shared/index.js';
import { Hash64Set, idHash, messagesHash, shuffleRank } from '../../src/producers/prepare/prompt-hash.js';
import { UniqueIds, promptId } from '../../src/producers/prepare/prompt-ids.js';
import { promptLine, shapePrompt } from '../../src/producers/prepare/prompt-shape.js';
import { formatPrepareCounts, emptyCounts } from '../../src/producers/prepare/prepare-report.js';
import type { SourceMessage } from '../../src/producers/prepare/source-types.js';

const u = (content: string): SourceMessage => ({ role: 'user', content });
const a = (content: string): SourceMessage => ({ role: 'assistant', content });

describe('shapePrompt', () => {
  it('drops the turns after the last user turn and keeps system and earlier turns', () => {
    const shaped = shapePrompt(
      [{ role: 'system', content: 'be brief' }, u('q1'), a('a1'), u('q2'), a('a2'), { role: 'tool', content: 'r' }],
      'last',
    );
    expect(shaped).toEqual({
      kind: 'prompt',
      droppedTrailing: 2,
      messages: [
        { role: 'system', content: 'be brief' },
        { role: 'user', content: 'q1' },
        { role: 'assistant', content: 'a1' },
        { role: 'user', content: 'q2' },
      ],
    });
  });

  it('keeps tool calls of earlier turns as the prompt file reader reads them', () => {
    const call = [{ type: 'function', function: { name: 'f', arguments: '{}' } }];
    const shaped = shapePrompt(
      [
        u('q'),
        { role: 'assistant', content: '', tool_calls: call },
        { role: 'tool', content: '1', tool_call_id: 'c1' },
        u('and?'),
      ],
      'last',
    );
    expect(shaped.kind).toBe('prompt');
    if (shaped.kind !== 'prompt') return;
    expect(shaped.messages[1]).toEqual({ role: 'assistant', content: '', tool_calls: call });
    expect(shaped.messages[2]).toEqual({ role: 'tool', content: '1', tool_call_id: 'c1' });
    // What prepare writes, the prompt file reader takes as it is.
    const back = parsePromptLine(promptLine('x', shaped.messages), 'p.jsonl', 1);
    expect(back).toEqual({ ok: true, record: { id: 'x', line: 1, messages: shaped.messages } });
  });

  it('a row without a user turn, or with a blank last one, is empty', () => {
    expect(shapePrompt([a('only')], 'last')).toEqual({ kind: 'empty', reason: 'no user turn' });
    expect(shapePrompt([], 'last')).toEqual({ kind: 'empty', reason: 'no turns' });
    expect(shapePrompt([u('q'), a('x'), u('  \n')], 'last')).toEqual({
      kind: 'empty',
      reason: 'the user turn to answer is empty',
    });
  });

  it('a turn the prompt file could not hold is malformed', () => {
    const shaped = shapePrompt([{ role: 'user', content: 'q', tool_calls: 'not json' }], 'last');
    expect(shaped.kind).toBe('malformed');
  });
});

describe('ids', () => {
  it('the source id when there is one, else the content hash generation uses', () => {
    const messages = [{ role: 'user' as const, content: 'hello' }];
    expect(promptId('abc', messages)).toBe('abc');
    expect(promptId(undefined, messages)).toBe(contentSampleId(messages));
    expect(promptId('  ', messages)).toBe(contentSampleId(messages));
    // The same rule as a prompt file line without an id.
    const parsed = parsePromptLine(JSON.stringify({ messages }), 'f', 1);
    expect(parsed.ok && parsed.record.id).toBe(promptId(undefined, messages));
  });

  it('a repeated id becomes unique with a suffix, in order', () => {
    const ids = new UniqueIds();
    expect(ids.assign('a')).toEqual({ id: 'a', renamed: false });
    expect(ids.assign('a')).toEqual({ id: 'a~2', renamed: true });
    expect(ids.assign('a~2')).toEqual({ id: 'a~2~2', renamed: true });
    expect(ids.assign('a')).toEqual({ id: 'a~3', renamed: true });
    expect(ids.assign('b')).toEqual({ id: 'b', renamed: false });
  });
});

describe('hashes', () => {
  it('the same messages hash the same; any field that differs, differently', () => {
    const m = [{ role: 'user' as const, content: 'x' }];
    expect(messagesHash(m)).toEqual(messagesHash([{ role: 'user', content: 'x' }]));
    expect(messagesHash(m)).not.toEqual(messagesHash([{ role: 'user', content: 'x ' }]));
    expect(messagesHash(m)).not.toEqual(messagesHash([{ role: 'system', content: 'x' }]));
  });

  it('shuffle ranks depend on the seed and the id only', () => {
    expect(shuffleRank(1, 'a')).toBe(shuffleRank(1, 'a'));
    expect(shuffleRank(1, 'a')).not.toBe(shuffleRank(2, 'a'));
  });

  it('Hash64Set holds many hashes exactly, the zero hash included, in about 16 bytes each', () => {
    const set = new Hash64Set();
    const n = 200_000;
    let added = 0;
    for (let i = 0; i < n; i += 1) if (set.add(idHash(`k${i}`))) added += 1;
    expect(added).toBe(n);
    expect(set.add({ hi: 0, lo: 0 })).toBe(true);
    expect(set.add({ hi: 0, lo: 0 })).toBe(false);
    expect(set.size).toBe(n + 1);
    let found = 0;
    for (let i = 0; i < n; i += 1) if (set.has(idHash(`k${i}`))) found += 1;
    expect(found).toBe(n);
    let falsePositives = 0;
    for (let i = 0; i < 10_000; i += 1) if (set.has(idHash(`other${i}`))) falsePositives += 1;
    expect(falsePositives).toBe(0);
    expect(set.add(idHash('k7'))).toBe(false);
    expect(set.bytes / set.size).toBeLessThanOrEqual(32);
  });
});

describe('formatPrepareCounts', () => {
  it('names every count status shows', () => {
    const c = {
      ...emptyCounts(),
      rowsRead: 1200,
      kept: 1000,
      duplicates: 100,
      duplicatesAcross: 50,
      tooLong: 20,
      empty: 10,
      malformed: 20,
    };
    expect(formatPrepareCounts(c)).toBe(
      '1,200 rows read, 1,000 kept, 150 duplicates, 20 too long, 10 empty, 20 malformed',
    );
  });
});
