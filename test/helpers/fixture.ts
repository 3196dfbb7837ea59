// The wiring the integration and fault tests share: a private Redis (startTestRedis), the SGLang
// simulator on a free port, a temp folder, and the CLI children of spawnCli, started before the
// tests of a file (or of a describe block, or of each test) and closed after them.
//
//   const { redis, sim, tmp } = useHarness({ redis: true, sim: { timeScale: 8, seed: 11 }, tmp: true, cli: true });
//
// registers one beforeAll that starts what the spec names and one afterAll that closes it all,
// whatever the tests did: the CLI children are killed first, then everything else is closed in
// the reverse order it started (simulators started by `startSim` during the tests, the spec's
// simulator, Redis, the temp folder), each close attempted even when another one fails.
//
// What it returns can be destructured at once: `redis`, `sim`, `scripts` and `keys` stand for
// the objects the hook starts (each property read goes to the live one), and `tmp.dir` is read
// when used; using one before the hook ran, or after the close, throws.
import { afterAll, afterEach, beforeAll, beforeEach } from 'vitest';
import { RunKeys, withScripts, type ScriptedRedis } from '../../src/shared/index.js';
import { startSimulator, type SimulatorHandle, type SimulatorOptions } from '../../src/sim/index.js';
import { killCliChildren } from './pipeline.js';
import { tempDir } from './temp.js';
import { startTestRedis, type StartTestRedisOptions, type TestRedis } from './redis.js';

export interface HarnessSpec {
  /** A private redis-server (startTestRedis), with these options when given. */
  redis?: true | StartTestRedisOptions;
  /** A connection with the Lua scripts loaded (`withScripts(redis.connection())`); implies `redis`. */
  scripts?: true;
  /** `new RunKeys(redis.prefix, keys)`: the keys of a run of that name; implies `redis`. */
  keys?: string;
  /** A simulator started with the rest (on a free port unless `port` says otherwise). */
  sim?: SimulatorOptions;
  /** The defaults of the simulators `startSim` starts (each call's options go over them). */
  simDefaults?: SimulatorOptions;
  /** A temp folder (tempDir): `true`, or the prefix of its name. */
  tmp?: true | string;
  /** Kill every CLI child process (spawnCli) still running, before anything else is closed. */
  cli?: true;
  /** `each`: start and close around every test (beforeEach/afterEach); default `all` (beforeAll/afterAll). */
  scope?: 'all' | 'each';
  /** Timeout of the start and close hooks (default: the config's hookTimeout). */
  timeoutMs?: number;
}

export interface TempDir {
  /** The folder's path. */
  readonly dir: string;
}

interface HarnessBase {
  /** Starts a simulator (options over `simDefaults`, a free port), closed with the rest; only once started. */
  startSim(options?: SimulatorOptions): Promise<SimulatorHandle>;
  /** Adds a close of the caller's own to the rest (run before those already there); only once started. */
  defer(close: () => unknown): void;
}

type WithRedis = { redis: unknown } | { scripts: unknown } | { keys: unknown };

/** What useHarness returns for a spec: the parts it names. */
export type Harness<S extends HarnessSpec> = HarnessBase &
  (S extends WithRedis ? { readonly redis: TestRedis } : unknown) &
  (S extends { scripts: unknown } ? { readonly scripts: ScriptedRedis } : unknown) &
  (S extends { keys: unknown } ? { readonly keys: RunKeys } : unknown) &
  (S extends { sim: unknown } ? { readonly sim: SimulatorHandle } : unknown) &
  (S extends { tmp: unknown } ? { readonly tmp: TempDir } : unknown);

/**
 * An object that stands for the one `current()` returns: each property read, write and call goes
 * to it. Throws, naming `what`, while there is none.
 */
function live<T extends object>(what: string, current: () => T | undefined): T {
  const target = (): T => {
    const v = current();
    if (v === undefined)
      throw new Error(`fixture: ${what} is not started (used outside the tests, or before its hook ran)`);
    return v;
  };
  return new Proxy({} as T, {
    get(_, prop) {
      // `await x` and `Promise.resolve(x)` look for `then`: answer "not a promise" rather than throw.
      if (prop === 'then') return undefined;
      const t = target();
      const v: unknown = Reflect.get(t, prop, t);
      return typeof v === 'function' ? (v as (...args: unknown[]) => unknown).bind(t) : v;
    },
    set(_, prop, value) {
      return Reflect.set(target(), prop, value);
    },
    has(_, prop) {
      return Reflect.has(target(), prop);
    },
    ownKeys() {
      return Reflect.ownKeys(target());
    },
    getOwnPropertyDescriptor(_, prop) {
      const d = Reflect.getOwnPropertyDescriptor(target(), prop);
      return d === undefined ? undefined : { ...d, configurable: true };
    },
  });
}

/** Runs every close, last added first, and throws what failed once all have run. */
async function closeAll(closes: (() => unknown)[]): Promise<void> {
  const errors: unknown[] = [];
  for (const close of closes.splice(0).reverse()) {
    try {
      await close();
    } catch (e: unknown) {
      errors.push(e);
    }
  }
  if (errors.length === 1) throw errors[0];
  if (errors.length > 1) throw new AggregateError(errors, `fixture: ${errors.length} closes failed`);
}

/**
 * Registers the hooks that start what `spec` names before the tests (of the file, or of the
 * describe block it is called in; of each test with `scope: 'each'`) and close it after them.
 */
export function useHarness<const S extends HarnessSpec>(spec: S): Harness<S> {
  let redis: TestRedis | undefined;
  let scripts: ScriptedRedis | undefined;
  let keys: RunKeys | undefined;
  let sim: SimulatorHandle | undefined;
  let tmp: { dir: string; cleanup: () => void } | undefined;
  let started = false;
  const closes: (() => unknown)[] = [];
  const wantsRedis = spec.redis !== undefined || spec.scripts !== undefined || spec.keys !== undefined;

  const start = async (): Promise<void> => {
    started = true;
    if (spec.tmp !== undefined) {
      const t = spec.tmp === true ? tempDir() : tempDir(spec.tmp);
      tmp = t;
      closes.push(() => {
        tmp = undefined;
        t.cleanup();
      });
    }
    // Redis and the simulator start side by side; whichever started is closed even if the other failed.
    const [r, s] = await Promise.allSettled([
      wantsRedis ? startTestRedis(typeof spec.redis === 'object' ? spec.redis : {}) : Promise.resolve(undefined),
      spec.sim === undefined ? Promise.resolve(undefined) : startSimulator({ port: 0, ...spec.sim }),
    ]);
    if (r.status === 'fulfilled' && r.value !== undefined) {
      const server = r.value;
      redis = server;
      closes.push(() => {
        redis = undefined;
        scripts = undefined;
        keys = undefined;
        return server.stop();
      });
      if (spec.scripts !== undefined) scripts = withScripts(server.connection());
      if (spec.keys !== undefined) keys = new RunKeys(server.prefix, spec.keys);
    }
    if (s.status === 'fulfilled' && s.value !== undefined) {
      const handle = s.value;
      sim = handle;
      closes.push(() => {
        sim = undefined;
        return handle.stop();
      });
    }
    if (r.status === 'rejected') throw r.reason;
    if (s.status === 'rejected') throw s.reason;
  };

  const close = async (): Promise<void> => {
    started = false;
    if (spec.cli !== undefined) closes.push(() => killCliChildren());
    await closeAll(closes);
  };

  const [before, after] = spec.scope === 'each' ? [beforeEach, afterEach] : [beforeAll, afterAll];
  before(start, spec.timeoutMs);
  after(close, spec.timeoutMs);

  const notStarted = (what: string): Error =>
    new Error(`fixture: ${what} outside the tests (before the harness started or after it closed)`);
  const harness: HarnessBase & {
    redis: TestRedis;
    scripts: ScriptedRedis;
    keys: RunKeys;
    sim: SimulatorHandle;
    tmp: TempDir;
  } = {
    async startSim(options = {}) {
      if (!started) throw notStarted('startSim');
      const handle = await startSimulator({ port: 0, ...spec.simDefaults, ...options });
      closes.push(() => handle.stop());
      return handle;
    },
    defer(fn) {
      if (!started) throw notStarted('defer');
      closes.push(fn);
    },
    redis: live('redis', () => redis),
    scripts: live('scripts', () => scripts),
    keys: live('keys', () => keys),
    sim: live('sim', () => sim),
    tmp: {
      get dir(): string {
        if (tmp === undefined) throw notStarted('tmp.dir');
        return tmp.dir;
      },
    },
  };
  return harness as Harness<S>;
}
