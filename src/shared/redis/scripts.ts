import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Redis } from 'ioredis';
import { AppError } from '../errors.js';

/**
 * Loads the Lua scripts in `./lua` onto a connection as custom commands.
 * File names follow BullMQ's convention `name-<numberOfKeys>.lua`; a file without the
 * suffix takes a variable number of keys, passed as the command's first argument.
 * A line `--- @include "name"` is replaced by `./lua/includes/name.lua`: a rule that several
 * scripts apply (e.g. when a dataset's budget is met) has one home there.
 */
const luaDir = fileURLToPath(new URL('./lua/', import.meta.url));
const INCLUDE_LINE = /^--- @include "([a-z0-9-]+)"$/gm;

interface ScriptSource {
  name: string;
  numberOfKeys: number | undefined;
  lua: string;
}

let sources: ScriptSource[] | undefined;

/** A script's text with its `--- @include` lines replaced by the snippets they name. */
function withIncludes(file: string, lua: string): string {
  return lua.replace(INCLUDE_LINE, (_, name: string) => {
    try {
      return readFileSync(`${luaDir}includes/${name}.lua`, 'utf8').trimEnd();
    } catch (e: unknown) {
      throw new AppError(`${file} includes "${name}", which is not in lua/includes/`, { cause: e });
    }
  });
}

function readSources(): ScriptSource[] {
  sources ??= readdirSync(luaDir)
    .filter((f) => f.endsWith('.lua'))
    .map((file) => {
      const m = /^(.*?)(?:-(\d+))?\.lua$/.exec(file);
      const base = m?.[1] ?? file;
      return {
        name: base.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase()),
        numberOfKeys: m?.[2] === undefined ? undefined : Number(m[2]),
        lua: withIncludes(file, readFileSync(luaDir + file, 'utf8')),
      };
    });
  return sources;
}

/** The commands the scripts add to a connection, typed. */
export interface TokenmillScripts {
  /** The code for one request; called with further requests (ARGV[12..]), an array of one code each. */
  acquireRequest(numKeys: number, ...keysAndArgs: (string | number)[]): Promise<number>;
  /** Per sample: committed (1 | 0), dataset tokens after it; flat, one pair per sample. */
  commitSample(...keysAndArgs: (string | number)[]): Promise<[number, number, ...number[]]>;
  failSample(...keysAndArgs: (string | number)[]): Promise<number>;
  finishConversation(...keysAndArgs: (string | number)[]): Promise<number>;
  /** The tool results recorded for the turn (these or the first ones), or null once the conversation finished. */
  recordToolResults(...keysAndArgs: (string | number)[]): Promise<string | null>;
  /** 1 reopened, 0 its end record changed meanwhile. */
  reopenConversation(...keysAndArgs: (string | number)[]): Promise<number>;
  /** Output tokens after it, or -1 when the turn was committed meanwhile. */
  discardAbortedTurn(...keysAndArgs: (string | number)[]): Promise<number>;
  skipSamples(...keysAndArgs: (string | number)[]): Promise<number>;
  spendAttempt(...keysAndArgs: (string | number)[]): Promise<number>;
  retryFailed(...keysAndArgs: (string | number)[]): Promise<number>;
  claimFailed(...keysAndArgs: (string | number)[]): Promise<number[]>;
  releaseClaims(...keysAndArgs: (string | number)[]): Promise<number>;
  completeDataset(...keysAndArgs: (string | number)[]): Promise<number>;
  renewLeases(numKeys: number, ...keysAndArgs: (string | number)[]): Promise<number[]>;
  budgetProgress(...keysAndArgs: (string | number)[]): Promise<number>;
  endProbation(...keysAndArgs: (string | number)[]): Promise<number>;
  lockRenew(...keysAndArgs: (string | number)[]): Promise<number>;
  lockRelease(...keysAndArgs: (string | number)[]): Promise<number>;
  lockSwap(...keysAndArgs: (string | number)[]): Promise<number>;
  sinkTrim(...keysAndArgs: (string | number)[]): Promise<number>;
  sinkDropDuplicate(...keysAndArgs: (string | number)[]): Promise<number>;
  sinkRestore(...keysAndArgs: (string | number)[]): Promise<number>;
}

export type ScriptedRedis = Redis & TokenmillScripts;

const loaded = new WeakSet<Redis>();

/** Defines every script on `redis` (once per connection) and returns it typed. */
export function withScripts(redis: Redis): ScriptedRedis {
  if (!loaded.has(redis)) {
    for (const s of readSources()) {
      redis.defineCommand(
        s.name,
        s.numberOfKeys === undefined ? { lua: s.lua } : { lua: s.lua, numberOfKeys: s.numberOfKeys },
      );
    }
    loaded.add(redis);
  }
  return redis as ScriptedRedis;
}

/** Outcome codes of `acquire-request.lua` below 1, mapped in this one place. */
export type AcquireOutcome =
  | { kind: 'acquired'; endpointIndex: number }
  | { kind: 'no-slot' }
  | { kind: 'budget-met' }
  | { kind: 'budget-reserved' }
  | { kind: 'already-done' }
  | { kind: 'paused' };

export function decodeAcquire(code: number): AcquireOutcome {
  if (code >= 1) return { kind: 'acquired', endpointIndex: code - 1 };
  switch (code) {
    case -1:
      return { kind: 'no-slot' };
    case -2:
      return { kind: 'budget-met' };
    case -3:
      return { kind: 'budget-reserved' };
    case -4:
      return { kind: 'already-done' };
    case -5:
      return { kind: 'paused' };
    default:
      throw new AppError(`acquire-request.lua returned an unknown code ${code}`);
  }
}
