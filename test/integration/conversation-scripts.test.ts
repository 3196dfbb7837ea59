// The Lua side of conversations regenerated turn by turn, on a real Redis: commit-sample-9.lua keeps
// a turn's output ids in its conversation's history in the same step as the commit (once, not on a
// duplicate) and counts the conversation started on turn 1; finish-conversation-4.lua records the
// end once, folds a failed turn's record into it and drops the history; a turn committed after the
// end (a racing delivery) is committed but leaves no history behind.
import { describe, expect, it } from 'vitest';

import { recordFailure } from '../../src/workers/inference/sample-records.js';
import { useHarness } from '../helpers/fixture.js';

const { scripts: r, keys } = useHarness({ scripts: true, keys: 'cs' });
const DS = 'd';

function commitTurn(conv: string, turn: number, outputIds: number[], rid: string): Promise<number[]> {
  const id = `${conv}#t${turn}`;
  const record = JSON.stringify({
    id,
    output_ids: outputIds,
    completion_tokens: outputIds.length,
    conversation_id: conv,
    turn,
    turns: 3,
    spliced: turn > 1,
  });
  return r.commitSample(
    keys.done(DS),
    keys.stats(DS),
    keys.results(DS),
    keys.inflight(DS),
    keys.endpointLeases('http://127.0.0.1:1'),
    keys.failed(DS),
    keys.skipped(DS),
    keys.attempts(DS),
    keys.rate(DS),
    id,
    outputIds.length,
    record,
    rid,
    10_000,
    30,
  );
}

function finish(conv: string, kind: 'complete' | 'ended', failedTurn = ''): Promise<number> {
  return r.finishConversation(
    keys.conversations(DS),
    keys.stats(DS),
    keys.failed(DS),
    keys.done(DS),
    conv,
    JSON.stringify({ kind }),
    kind,
    failedTurn,
  );
}

describe('conversation scripts', () => {
  it('keep the history with each first commit, end a conversation once, and leave nothing after its end', async () => {
    expect(await commitTurn('a', 1, [5, 6, 7], 'r1')).toEqual([1, 3]);
    expect(await commitTurn('a', 1, [9, 9], 'r2')).toEqual([0, 3]); // a duplicate: the first answer stays
    expect(await commitTurn('a', 2, [], 'r3')).toEqual([1, 3]);
    expect(await r.hgetall(keys.conversationHistory(DS, 'a'))).toEqual({ '1': '[5,6,7]', '2': '{}' });
    const stats = await r.hgetall(keys.stats(DS));
    expect(stats.conversationsStarted).toBe('1');
    expect(stats.turnsSpliced).toBe('1');

    // Ended with turn 3's failure folded in: once, the history gone.
    await r.hset(keys.failed(DS), 'a#t3', JSON.stringify({ reason: 'HTTP 400' }));
    expect(await finish('a', 'ended', 'a#t3')).toBe(1);
    expect(await finish('a', 'complete')).toBe(0);
    expect(await r.exists(keys.conversationHistory(DS, 'a'))).toBe(0);
    expect(await r.hexists(keys.failed(DS), 'a#t3')).toBe(0);
    expect(JSON.parse((await r.hget(keys.conversations(DS), 'a')) ?? '')).toEqual({ kind: 'ended' });
    expect((await r.hgetall(keys.stats(DS))).conversationsEnded).toBe('1');
    expect((await r.hgetall(keys.stats(DS))).conversationsComplete).toBeUndefined();

    // A racing delivery commits turn 3 after the end: committed and counted, no history recreated.
    expect(await commitTurn('a', 3, [1], 'r4')).toEqual([1, 4]);
    expect(await r.exists(keys.conversationHistory(DS, 'a'))).toBe(0);
  });

  it('an early end counts its cause and names the latest conversation that ended so (ended-example:<cause>); a complete one names none', async () => {
    const end = (conv: string, kind: 'complete' | 'ended', cause: string): Promise<number> =>
      r.finishConversation(
        keys.conversations(DS),
        keys.stats(DS),
        keys.failed(DS),
        keys.done(DS),
        conv,
        JSON.stringify({ kind }),
        kind,
        '',
        cause,
      );
    expect(await end('x1', 'ended', 'context')).toBe(1);
    expect(await end('x2', 'ended', 'context')).toBe(1);
    expect(await end('x3', 'ended', 'tool-mismatch')).toBe(1);
    expect(await end('x2', 'ended', 'context')).toBe(0); // already ended: nothing changes
    expect(await end('x4', 'complete', '')).toBe(1);
    const stats = await r.hgetall(keys.stats(DS));
    expect(stats['ended:context']).toBe('2');
    expect(stats['ended-example:context']).toBe('x2');
    expect(stats['ended:tool-mismatch']).toBe('1');
    expect(stats['ended-example:tool-mismatch']).toBe('x3');
    expect(
      Object.keys(stats)
        .filter((k) => k.startsWith('ended-example:'))
        .sort(),
    ).toEqual(['ended-example:context', 'ended-example:tool-mismatch']);
  });

  it('a failure of a turn another delivery committed first records nothing, and says so (the conversation goes on)', async () => {
    expect((await commitTurn('b', 1, [4, 2], 'r5'))[0]).toBe(1);
    const failure = { status: undefined, attempts: 3, endpoint: undefined, rid: 'r6', leaseKey: keys.inflight(DS) };
    const req = (id: string) => ({
      dataset: DS,
      sample: { id, line: 2, promptIds: [1], maxNewTokens: 8 },
      sampling: {},
      maxAttempts: 3,
      priorExpectedTokens: 8,
      attemptsSpent: 0,
    });
    // Before, the caller ignored this and ended the conversation on a turn that was committed.
    expect(await recordFailure(r, keys, req('b#t1'), { ...failure, reason: 'HTTP 500' })).toBe(false);
    expect(await r.hexists(keys.failed(DS), 'b#t1')).toBe(0);
    expect(await recordFailure(r, keys, req('b#t2'), { ...failure, reason: 'HTTP 400' })).toBe(true);
    expect(await r.hexists(keys.failed(DS), 'b#t2')).toBe(1);
  });
});
