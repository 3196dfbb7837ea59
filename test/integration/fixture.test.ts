// The tests' own harness (test/helpers/fixture.ts): what it starts is there during the tests,
// everything it started is gone after them, closed last-started first, and using it outside
// the tests throws.
import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { useHarness, type Harness } from '../helpers/fixture.js';

const closed: string[] = [];
let seen: { dir: string; pid: number | undefined; simUrl: string } | undefined;
let first: Harness<{ redis: true; tmp: true }> | undefined;

describe('useHarness', () => {
  const h = useHarness({ redis: true, scripts: true, keys: 'fx', sim: { seed: 1 }, tmp: 'tm-fixture-' });
  first = h;

  it("gives a private Redis with the scripts and a run's keys, a simulator and a temp folder", async () => {
    expect(await h.redis.connection('client').ping()).toBe('PONG');
    expect(h.redis.port).not.toBe(6379);
    expect(h.keys.stats('ds')).toContain(h.redis.prefix);
    expect(typeof h.scripts.commitSample).toBe('function');
    expect((await fetch(`${h.sim.url}/health`)).status).toBe(200);
    expect(existsSync(h.tmp.dir)).toBe(true);
    expect(h.tmp.dir).toContain('tm-fixture-');
    seen = { dir: h.tmp.dir, pid: h.redis.server.pid, simUrl: h.sim.url };
  });

  it('starts more simulators on demand; closes of its own run with the rest, last added first', async () => {
    const more = await h.startSim({ maxRunningRequests: 2 });
    expect(more.url).not.toBe(h.sim.url);
    h.defer(() => closed.push('first'));
    h.defer(() => closed.push('second'));
  });
});

describe('after the harness closed', () => {
  it('ran the closes in reverse, stopped Redis and the simulator, removed the folder', async () => {
    expect(closed).toEqual(['second', 'first']);
    if (seen === undefined) throw new Error('the first suite did not run');
    const { dir, pid, simUrl } = seen;
    expect(existsSync(dir)).toBe(false);
    expect(pid).toBeDefined();
    expect(() => process.kill(pid ?? 0, 0)).toThrow();
    await expect(fetch(`${simUrl}/health`)).rejects.toThrow();
  });

  it('throws, naming what, when used after the close', () => {
    expect(() => first?.redis.url).toThrow(/redis is not started/);
    expect(() => first?.tmp.dir).toThrow(/tmp\.dir outside the tests/);
  });
});

describe('scope: each', () => {
  const { tmp } = useHarness({ tmp: true, scope: 'each' });
  const dirs: string[] = [];

  it('gives each test a folder of its own', () => {
    dirs.push(tmp.dir);
  });

  it('and removes it after the test', () => {
    dirs.push(tmp.dir);
    expect(dirs[0]).not.toBe(dirs[1]);
    expect(existsSync(dirs[0] ?? '')).toBe(false);
  });
});
