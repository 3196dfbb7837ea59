// Benchmark: `turns: all` on several SGLang endpoints. (1) Prefix cache: the share of prompt
// tokens of turns >= 2 that the server answered from its prefix cache (`meta_info.cached_tokens`
// over `prompt_tokens`), with 8 endpoints against 1 of the same total slots; a turn that does
// not go back to the endpoint of its previous turn finds nothing of its conversation cached
// there. Each simulator sits behind a small HTTP proxy of this file that reads every
// /generate answer (rid, prompt_tokens, cached_tokens). (2) Throughput: output tokens/s that
// the simulator decodes in a window of steady state (after a warm-up, while conversations are
// still waiting to start: no drain tail) for multi-turn generation against single-turn
// generation of as many requests with the same completion lengths and prompts about as long as
// the turns' mean prompt, on one endpoint.
import http from 'node:http';
import { startSimulator, type SimulatorHandle } from '../src/sim/index.js';
import { bundledTokenizerPath, loadTokenizer } from '../src/shared/index.js';
import { writeConversations } from '../test/helpers/conversations.js';
import {
  benchConfig,
  fmtInt,
  isMain,
  longPrompt,
  openBenchEnv,
  round,
  runAsScript,
  startTokenmill,
  writePrompts,
  type BenchEnv,
  type BenchResult,
} from './lib.js';
import { steadyWindow } from './steady-window.js';

export interface MultiTurnCacheOptions {
  /** Slots in all (per endpoint: slots / endpoints), in both the cache and the throughput runs. */
  slots: number;
  /** Endpoints of the cache run compared with one. */
  endpoints: number;
  cache: { conversations: number; turns: number; outputMin: number; outputMax: number; timeScale: number };
  throughput: {
    conversations: number;
    turns: number;
    outputMin: number;
    outputMax: number;
    timeScale: number;
    /** Simulated seconds from the first request to the window's start, and of the window. */
    warmupSimS: number;
    windowSimS: number;
  };
  /** Required cached share (8 endpoints) / cached share (1 endpoint), turns >= 2. */
  targetCacheRatio: number;
  /** Required multi-turn / single-turn output tokens/s. */
  targetThroughputRatio: number;
}

export const DEFAULT_MULTI_TURN_CACHE: MultiTurnCacheOptions = {
  slots: 64,
  endpoints: 8,
  cache: { conversations: 200, turns: 6, outputMin: 100, outputMax: 300, timeScale: 20 },
  // T(64) is ~1,700 tok/s: 160 conversations of 4 turns of ~1,000 tokens are ~380 simulated s,
  // of which the first ~230 have conversations waiting to start.
  throughput: {
    conversations: 160,
    turns: 4,
    outputMin: 500,
    outputMax: 1500,
    timeScale: 20,
    warmupSimS: 40,
    windowSimS: 150,
  },
  targetCacheRatio: 0.9,
  targetThroughputRatio: 0.97,
};

/** What the proxy saw of one /generate answer. */
interface Seen {
  rid: string;
  endpoint: number;
  promptTokens: number;
  cachedTokens: number;
}

/**
 * An HTTP proxy in front of `target` that passes every request through and records, for each
 * /generate answered 200, its rid and `meta_info.prompt_tokens` / `cached_tokens`.
 */
async function startRecordingProxy(
  target: SimulatorHandle,
  endpoint: number,
  seen: Seen[],
): Promise<{ url: string; close(): Promise<void> }> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
  const server = http.createServer((req, res) => {
    const body: Buffer[] = [];
    req.on('data', (c: Buffer) => body.push(c));
    req.on('end', () => {
      const up = http.request(
        { host: '127.0.0.1', port: target.port, path: req.url, method: req.method, headers: req.headers, agent },
        (answer) => {
          const chunks: Buffer[] = [];
          answer.on('data', (c: Buffer) => chunks.push(c));
          answer.on('end', () => {
            const out = Buffer.concat(chunks);
            if (req.url === '/generate' && answer.statusCode === 200) {
              try {
                const sent = JSON.parse(Buffer.concat(body).toString('utf8')) as { rid?: string };
                const got = JSON.parse(out.toString('utf8')) as {
                  meta_info?: { prompt_tokens?: number; cached_tokens?: number };
                };
                if (typeof sent.rid === 'string')
                  seen.push({
                    rid: sent.rid,
                    endpoint,
                    promptTokens: got.meta_info?.prompt_tokens ?? 0,
                    cachedTokens: got.meta_info?.cached_tokens ?? 0,
                  });
              } catch {
                // Not JSON (a streamed answer): not counted.
              }
            }
            res.writeHead(answer.statusCode ?? 502, answer.headers);
            res.end(out);
          });
        },
      );
      up.on('error', () => res.destroy());
      up.end(Buffer.concat(body));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  const port = typeof address === 'object' && address !== null ? address.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      agent.destroy();
    },
  };
}

/** The conversation and turn of a turn's rid (`<dataset>/<conv>#t<k>#<tag>`). */
function turnOf(rid: string): { conversation: string; turn: number } | undefined {
  const m = /^[^/]+\/(.+)#t(\d+)#[^#]+$/.exec(rid);
  return m === null ? undefined : { conversation: m[1] as string, turn: Number(m[2]) };
}

interface CacheRun {
  endpoints: number;
  /** Cached prompt tokens / prompt tokens of turns >= 2. */
  cachedShare: number;
  /** Turns >= 2 sent to the endpoint of their previous turn. */
  followedShare: number;
  turns: number;
  promptTokensTurns2Plus: number;
  wallS: number;
}

async function runCache(env: BenchEnv, o: MultiTurnCacheOptions, endpoints: number): Promise<CacheRun> {
  const c = o.cache;
  const per = Math.max(1, Math.floor(o.slots / endpoints));
  const sims: SimulatorHandle[] = [];
  const proxies: { url: string; close(): Promise<void> }[] = [];
  const seen: Seen[] = [];
  const t0 = performance.now();
  try {
    for (let i = 0; i < endpoints; i += 1) {
      const sim = await startSimulator({
        timeScale: c.timeScale,
        maxRunningRequests: per,
        seed: 40 + i,
        outputLength: {
          distribution: 'uniform',
          mean: (c.outputMin + c.outputMax) / 2,
          min: c.outputMin,
          max: c.outputMax,
        },
      });
      sims.push(sim);
      proxies.push(await startRecordingProxy(sim, i, seen));
    }
    const run = `cache-${endpoints}`;
    const config = benchConfig(env, {
      run,
      endpoint: '',
      endpoints: proxies.map((p) => p.url),
      concurrency: per,
      datasets: [
        {
          name: 'conv',
          prompts: 'cache-conv.jsonl',
          turns: 'all',
          tokenBudget: 1_000_000_000,
          maxNewTokens: c.outputMax,
          batchSize: 8,
        },
      ],
    });
    const gen = await startTokenmill(config);
    try {
      await gen.handle.finished;
    } finally {
      await gen.stop();
    }
  } finally {
    for (const p of proxies) await p.close();
    for (const s of sims) await s.stop();
  }
  // The last answer of each turn (a turn sent again after an error would count twice).
  const byTurn = new Map<string, Seen & { conversation: string; turn: number }>();
  for (const s of seen) {
    const t = turnOf(s.rid);
    if (t !== undefined) byTurn.set(`${t.conversation}#${t.turn}`, { ...s, ...t });
  }
  let prompt = 0;
  let cached = 0;
  let later = 0;
  let followed = 0;
  for (const t of byTurn.values()) {
    if (t.turn < 2) continue;
    later += 1;
    prompt += t.promptTokens;
    cached += t.cachedTokens;
    if (byTurn.get(`${t.conversation}#${t.turn - 1}`)?.endpoint === t.endpoint) followed += 1;
  }
  const expected = c.conversations * c.turns;
  if (byTurn.size !== expected)
    throw new Error(`cache run on ${endpoints}: ${byTurn.size} turns seen, ${expected} expected`);
  return {
    endpoints,
    cachedShare: round(cached / Math.max(1, prompt), 4),
    followedShare: round(followed / Math.max(1, later), 4),
    turns: byTurn.size,
    promptTokensTurns2Plus: prompt,
    wallS: round((performance.now() - t0) / 1000, 1),
  };
}

type Kind = 'multi-turn' | 'single-turn';

interface ThroughputRun {
  kind: Kind;
  /** Decoded tokens per simulated second over the window. */
  tokensPerSimS: number;
  windowTokens: number;
  meanRunning: number;
  /** Mean prompt tokens of the requests received up to the window's end. */
  meanPromptTokens: number;
}

async function runThroughput(env: BenchEnv, o: MultiTurnCacheOptions, kind: Kind): Promise<ThroughputRun> {
  const t = o.throughput;
  const sim = await startSimulator({
    timeScale: t.timeScale,
    maxRunningRequests: o.slots,
    seed: 9,
    outputLength: {
      distribution: 'uniform',
      mean: (t.outputMin + t.outputMax) / 2,
      min: t.outputMin,
      max: t.outputMax,
    },
  });
  try {
    const config = benchConfig(env, {
      run: kind,
      endpoint: sim.url,
      concurrency: o.slots,
      datasets: [
        kind === 'multi-turn'
          ? {
              name: 'tp',
              prompts: 'tp-conv.jsonl',
              turns: 'all',
              tokenBudget: 1_000_000_000,
              maxNewTokens: t.outputMax,
              batchSize: 8,
            }
          : { name: 'tp', prompts: 'tp-single.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: t.outputMax },
      ],
    });
    const gen = await startTokenmill(config);
    try {
      // Still in steady state at the window's end: some conversation (or prompt) not yet sent.
      const total = kind === 'multi-turn' ? t.conversations : t.conversations * t.turns;
      const w = await steadyWindow(sim, t, kind, (received) => {
        const firsts = kind === 'multi-turn' ? received.filter((r) => /#t1#/.test(r.rid)).length : received.length;
        return firsts < total;
      });
      return {
        kind,
        tokensPerSimS: w.tokensPerSimS,
        windowTokens: w.windowTokens,
        meanRunning: w.meanRunning,
        meanPromptTokens: w.meanPromptTokens,
      };
    } finally {
      await gen.stop();
    }
  } finally {
    await sim.stop();
  }
}

export async function multiTurnCache(o: MultiTurnCacheOptions = DEFAULT_MULTI_TURN_CACHE): Promise<BenchResult> {
  const started = performance.now();
  const env = await openBenchEnv('multi-turn-cache');
  try {
    writeConversations(env.dir, 'cache-conv', o.cache.conversations, o.cache.turns);
    const t = o.throughput;
    writeConversations(env.dir, 'tp-conv', t.conversations, t.turns);
    // Single-turn prompts about as long as the turns' mean prompt: turn k carries k - 1 answers
    // of the mean length and k questions.
    const tok = await loadTokenizer(bundledTokenizerPath());
    const meanOut = (t.outputMin + t.outputMax) / 2;
    const wantTokens = 30 + ((t.turns - 1) / 2) * (meanOut + 25);
    const probe = tok.encodePrompt([{ role: 'user', content: longPrompt(0, 4000) }]).length;
    const chars = Math.round((4000 * wantTokens) / probe);
    writePrompts(env.dir, 'tp-single', t.conversations * t.turns, (i) => ({
      id: `s-${i}`,
      prompt: longPrompt(i, chars),
    }));

    const one = await runCache(env, o, 1);
    const many = await runCache(env, o, o.endpoints);
    const cacheRatio = many.cachedShare / Math.max(1e-9, one.cachedShare);
    const single = await runThroughput(env, o, 'single-turn');
    const multi = await runThroughput(env, o, 'multi-turn');
    const throughputRatio = multi.tokensPerSimS / Math.max(1e-9, single.tokensPerSimS);

    const summary = [
      `prefix cache: ${o.cache.conversations} conversations of ${o.cache.turns} turns, completions ${o.cache.outputMin}-${o.cache.outputMax} tokens, ${o.slots} slots in all, timeScale ${o.cache.timeScale}`,
      ...[one, many].map(
        (r) =>
          `${r.endpoints} endpoint(s) x ${Math.floor(o.slots / r.endpoints)} slots: cached share of turns >= 2 ${r.cachedShare}, turns on their previous turn's endpoint ${r.followedShare} (${fmtInt(r.promptTokensTurns2Plus)} prompt tokens, ${r.wallS} s)`,
      ),
      `cached share ${o.endpoints} endpoints / 1: ${cacheRatio.toFixed(3)}`,
      `throughput: ${t.conversations} conversations of ${t.turns} turns against ${t.conversations * t.turns} single-turn prompts, completions ${t.outputMin}-${t.outputMax}, ${o.slots} slots, timeScale ${t.timeScale}; window ${t.windowSimS} simulated s after ${t.warmupSimS} s`,
      ...[single, multi].map(
        (r) =>
          `${r.kind}: ${fmtInt(r.tokensPerSimS)} output tok/s (simulated), ${r.meanRunning}/${o.slots} running, mean prompt ${fmtInt(r.meanPromptTokens)} tokens`,
      ),
      `multi-turn / single-turn: ${throughputRatio.toFixed(3)}`,
    ];
    const cacheMet = cacheRatio >= o.targetCacheRatio;
    const tpMet = throughputRatio >= o.targetThroughputRatio;
    return {
      name: 'multi-turn-cache',
      ok: cacheMet && tpMet,
      targets: [
        {
          what: `cached share of turns >= 2, ${o.endpoints} endpoints / 1`,
          required: `>= ${o.targetCacheRatio}`,
          measured: cacheRatio.toFixed(3),
          met: cacheMet,
        },
        {
          what: 'multi-turn output tokens/s / single-turn',
          required: `>= ${o.targetThroughputRatio}`,
          measured: throughputRatio.toFixed(3),
          met: tpMet,
        },
      ],
      metrics: {
        config: o,
        cache: { one, many },
        cacheRatio: round(cacheRatio, 4),
        throughput: { single, multi },
        throughputRatio: round(throughputRatio, 4),
      },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => multiTurnCache());
