// The outage lines of `run`, `produce` and `worker` (src/cli/redis-outage.ts): one line when
// Redis stops answering, a reminder every period while it stays away (never a flood), one when
// it is back. Against a real redis-server that is started late on its port.
import { afterAll, describe, expect, it } from 'vitest';
import { watchRedisOutage } from '../../src/cli/redis-outage.js';
import { EmbeddedRedis, findFreePort } from '../../src/shared/index.js';
import { waitFor } from '../helpers/pipeline.js';
import { tempDir } from '../helpers/temp.js';
import { quietLogger } from '../helpers/redis.js';

const closes: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const c of closes.reverse()) await c().catch(() => undefined);
});

describe('watchRedisOutage', () => {
  it('says once that Redis is not answering, reminds at its period, and says when it is back', async () => {
    const port = await findFreePort();
    const lines: string[] = [];
    const stop = watchRedisOutage(`redis://127.0.0.1:${port}`, {
      probeIntervalMs: 100,
      probeTimeoutMs: 500,
      remindEveryMs: 1_000,
      write: (l) => lines.push(l),
    });
    closes.push(stop);
    await waitFor(() => lines.some((l) => l.includes('still not answering')), 'a reminder', 10_000);
    const startedAt = Date.now();
    // The window is the point: ten more probes fail in it (one every 100 ms), and they add at most
    // one reminder, not a line each.
    await new Promise((r) => setTimeout(r, 1_000));
    const down = lines.length;
    // About 15 probes failed by now: one first line and one reminder a second, not one line a probe.
    expect(lines.filter((l) => l.includes('is not answering'))).toHaveLength(1);
    expect(down).toBeLessThanOrEqual(2 + Math.ceil((Date.now() - startedAt) / 1_000) + 2);
    expect(lines[0]).toMatch(
      new RegExp(
        `^tokenmill: Redis at redis://127\\.0\\.0\\.1:${port}/? is not answering \\(.+\\); waiting for it to come back`,
      ),
    );

    const { dir, cleanup } = tempDir('tokenmill-outage-');
    closes.push(async () => cleanup());
    const server = new EmbeddedRedis({ dataDir: dir, port, logger: quietLogger() });
    await server.start();
    closes.push(() => server.stop());
    await waitFor(
      () => lines.some((l) => /is back after \S+; carrying on/.test(l)),
      'the line saying it is back',
      10_000,
    );
    const after = lines.length;
    // The window is the point: five more probes succeed in it, and say nothing more.
    await new Promise((r) => setTimeout(r, 500));
    expect(lines.length).toBe(after);
  }, 30_000);
});
