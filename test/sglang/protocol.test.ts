// Every response field the client relies on, from a real SGLang 0.5.23: /generate (plain and
// streamed), /abort_request, /health_generate, /model_info, /server_info, /v1/loads (and /get_load's
// 404), /metrics, parsed with the client's own schemas and code, and each answer compared with
// what the simulator says for the same call, so that the simulator-based tests keep telling the truth.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolveContextLength } from '../../src/cli/run-context.js';
import { loadConfig, SglangClient } from '../../src/shared/index.js';
import { parseGenerateResponse, parseLoad, parseModelInfo, parseServerInfo } from '../../src/shared/sglang/schemas.js';
import { startSimulator, type SimulatorHandle } from '../../src/sim/index.js';
import { ServerLoadProbe } from '../../src/workers/inference/concurrency-probe.js';
import { waitFor } from '../helpers/pipeline.js';
import { realSglang, skipReason } from '../helpers/real-sglang.js';

const skip = skipReason();
const prompt = [9707, 11, 1879, 0, 220, 108386];
const sampling = { temperature: 1, top_k: 20 };

async function post(url: string, body: unknown): Promise<{ status: number; json: unknown; text: string }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text };
}

async function get(url: string): Promise<{ status: number; json: unknown }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json };
}

describe.skipIf(skip !== '')(
  `the client against a real SGLang 0.5.23${skip === '' ? '' : ` (skipped: ${skip})`}`,
  () => {
    let url: string;
    let client: SglangClient;
    let sim: SimulatorHandle;

    beforeAll(async () => {
      url = realSglang().url;
      client = new SglangClient({ endpoint: url, concurrency: 4, requestTimeoutMs: 60_000 });
      sim = await startSimulator({
        port: 0,
        seed: 5,
        timeScale: 20,
        outputLength: { distribution: 'fixed', mean: 400 },
      });
    });

    afterAll(async () => {
      await client?.close();
      await sim?.stop();
    });

    it('/generate: the raw body parses with the schema; output_ids are the completion, finish_reason length, counts right', async () => {
      const r = await post(`${url}/generate`, {
        input_ids: prompt,
        sampling_params: { ...sampling, max_new_tokens: 12 },
        rid: 'proto-plain',
      });
      expect(r.status).toBe(200);
      const parsed = parseGenerateResponse(r.json);
      expect(parsed.ok, parsed.ok ? '' : parsed.problem).toBe(true);
      if (!parsed.ok) return;
      expect(parsed.value.droppedLeadingIds).toBe(0);
      expect(parsed.value.outputIds).toHaveLength(12);
      expect(parsed.value.completionTokens).toBe(12);
      expect(parsed.value.promptTokens).toBe(prompt.length);
      expect(parsed.value.finishReason).toMatchObject({ type: 'length', length: 12 });
      expect(parsed.value.metaInfo['id']).toBe('proto-plain');
      expect(typeof parsed.value.e2eLatencySec).toBe('number');
      // Every id is inside the served vocabulary (151669 = the tokenizer's size).
      expect(parsed.value.outputIds.every((id) => Number.isInteger(id) && id >= 0 && id < 151_669)).toBe(true);
      // The client gives the same shape.
      const viaClient = await client.generate({
        inputIds: prompt,
        samplingParams: sampling,
        maxNewTokens: 5,
        rid: 'proto-client',
      });
      expect(viaClient.outputIds).toHaveLength(5);
      expect(viaClient.finishReason.type).toBe('length');
    });

    it('streamed /generate: progress as it comes, the last event is the whole completion (output_ids cumulative), as the simulator streams', async () => {
      const seen: number[] = [];
      const streamed = await client.generate({
        inputIds: prompt,
        samplingParams: sampling,
        maxNewTokens: 16,
        rid: 'proto-stream',
        onProgress: (n) => seen.push(n),
      });
      expect(streamed.completionTokens).toBe(16);
      expect(streamed.outputIds).toHaveLength(16);
      expect(streamed.finishReason).toMatchObject({ type: 'length', length: 16 });
      expect(seen.length).toBeGreaterThan(1);
      expect([...seen].sort((a, b) => a - b)).toEqual(seen);
      expect(seen[seen.length - 1]).toBe(16);
      // Raw: `data: {…}` events then `data: [DONE]`; intermediate events carry finish_reason null and the output so far.
      const raw = await post(`${url}/generate`, {
        input_ids: prompt,
        sampling_params: { ...sampling, max_new_tokens: 4 },
        rid: 'proto-raw',
        stream: true,
      });
      const events = raw.text
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trim());
      expect(events[events.length - 1]).toBe('[DONE]');
      const bodies = events
        .slice(0, -1)
        .map(
          (e) =>
            JSON.parse(e) as { output_ids: number[]; meta_info: { finish_reason: unknown; completion_tokens: number } },
        );
      expect(bodies.length).toBeGreaterThan(1);
      bodies.forEach((b) => expect(b.output_ids).toHaveLength(b.meta_info.completion_tokens));
      expect(bodies.slice(0, -1).every((b) => b.meta_info.finish_reason === null)).toBe(true);
      const simRaw = await post(`${sim.url}/generate`, {
        input_ids: prompt,
        sampling_params: { max_new_tokens: 4 },
        rid: 'sim-raw',
        stream: true,
      });
      const simEvents = simRaw.text
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trim());
      expect(simEvents[simEvents.length - 1]).toBe('[DONE]');
      const simBodies = simEvents
        .slice(0, -1)
        .map(
          (e) =>
            JSON.parse(e) as { output_ids: number[]; meta_info: { finish_reason: unknown; completion_tokens: number } },
        );
      simBodies.forEach((b) => expect(b.output_ids).toHaveLength(b.meta_info.completion_tokens));
    });

    it('/abort_request: a streamed request stops with finish_reason abort and its partial output; an unknown rid answers 200', async () => {
      let produced = 0;
      const pending = client.generate({
        inputIds: prompt,
        samplingParams: sampling,
        maxNewTokens: 3_000,
        rid: 'proto-abort',
        onProgress: (n) => (produced = n),
      });
      await waitFor(() => produced >= 5, 'some tokens streamed', 60_000, 10);
      await client.abort('proto-abort');
      const result = await pending;
      expect(result.finishReason.type).toBe('abort');
      expect(result.completionTokens).toBeGreaterThanOrEqual(produced);
      expect(result.completionTokens).toBeLessThan(3_000);
      expect(result.outputIds).toHaveLength(result.completionTokens);
      const unknown = await post(`${url}/abort_request`, { rid: 'no-such-request' });
      expect(unknown.status).toBe(200);
      expect((await post(`${sim.url}/abort_request`, { rid: 'no-such-request' })).status).toBe(200);
      // A plain (not streamed) request aborted: the same.
      const plain = client.generate({
        inputIds: prompt,
        samplingParams: sampling,
        maxNewTokens: 3_000,
        rid: 'proto-abort-plain',
      });
      await new Promise((r) => setTimeout(r, 1_000));
      await client.abort('proto-abort-plain');
      const cut = await plain;
      expect(cut.finishReason.type).toBe('abort');
      expect(cut.outputIds).toHaveLength(cut.completionTokens);
    });

    it('/health_generate, /model_info, /server_info: ok and parsed; /server_info has no context_length unless it was set', async () => {
      expect(await client.healthGenerate()).toMatchObject({ ok: true, status: 200 });
      expect(await client.health()).toMatchObject({ ok: true });
      const info = await get(`${url}/model_info`);
      const mi = parseModelInfo(info.json);
      expect(mi.ok, mi.ok ? '' : mi.problem).toBe(true);
      expect((await client.modelInfo()).model_path).toMatch(/tiny-qwen3$/);
      expect((await client.modelInfo()).is_generation).toBe(true);
      const si = parseServerInfo((await get(`${url}/server_info`)).json);
      expect(si.ok, si.ok ? '' : si.problem).toBe(true);
      const server = await client.serverInfo();
      expect(server.version).toBe('0.5.23');
      expect(server.max_total_num_tokens).toBeGreaterThan(0);
      // launch_server without --context-length: the argument is null here (the model's length is elsewhere).
      expect(server.context_length).toBeNull();
    });

    it('the context length is found without --context-length (/server_info has max_req_input_len), so maxNewTokens is capped to fit', async () => {
      const cfg = loadConfig({
        object: {
          run: 'ctx',
          sglang: { endpoints: [url] },
          datasets: [{ name: 'ds', prompts: 'none.jsonl', tokenBudget: 1, maxNewTokens: 16 }],
        },
        baseDir: process.cwd(),
      });
      const contextLength = await resolveContextLength(cfg);
      // The tiny model's 4096 positions, less what the server keeps back: prompt + completion must fit.
      expect(contextLength).toBeGreaterThan(4_000);
      expect(contextLength).toBeLessThanOrEqual(4_096);
      // Over the context, the server refuses the request outright (what an uncapped maxNewTokens would get).
      const over = await post(`${url}/generate`, {
        input_ids: prompt,
        sampling_params: { ...sampling, max_new_tokens: 5_000 },
        rid: 'proto-over',
      });
      expect(over.status).toBe(400);
      expect(over.text).toContain('maximum context length');
      const fits = await post(`${url}/generate`, {
        input_ids: prompt,
        sampling_params: { ...sampling, max_new_tokens: 2 },
        rid: 'proto-fits',
      });
      expect(fits.status).toBe(200);
    });

    it('load: /get_load is 404 and /v1/loads answers running and waiting per rank; getLoad() reads it', async () => {
      expect((await get(`${url}/get_load`)).status).toBe(404);
      const v1 = await get(`${url}/v1/loads`);
      expect(v1.status).toBe(200);
      const parsed = parseLoad(v1.json);
      expect(parsed.ok, parsed.ok ? '' : parsed.problem).toBe(true);
      if (!parsed.ok) return;
      expect(parsed.value).toHaveLength(1);
      expect(typeof parsed.value[0]?.num_running_reqs).toBe('number');
      expect(typeof parsed.value[0]?.num_waiting_reqs).toBe('number');
      const load = await client.getLoad();
      expect(load[0]?.dp_rank).toBe(0);
      expect(typeof load[0]?.num_running_reqs).toBe('number');
    });

    it('/metrics: the load probe reads running, queued and the decoded-token counter, and sees requests running', async () => {
      const probe = new ServerLoadProbe(url);
      const idle = await probe.read();
      expect(probe.readsMetrics).toBe(true);
      expect(idle.running).toBe(0);
      expect(idle.queued).toBe(0);
      expect(idle.generationTokensTotal).toBeGreaterThan(0);
      const busy = Array.from({ length: 4 }, (_, i) =>
        client.generate({ inputIds: prompt, samplingParams: sampling, maxNewTokens: 100, rid: `proto-busy-${i}` }),
      );
      const during = await waitFor(
        async () => {
          const s = await probe.read();
          return s.running >= 2 ? s : undefined;
        },
        'the probe to see requests running',
        30_000,
        100,
      );
      expect(during?.running).toBeLessThanOrEqual(4);
      await Promise.all(busy);
      const after = await probe.read();
      expect(after.generationTokensTotal).toBeGreaterThanOrEqual((idle.generationTokensTotal ?? 0) + 400);
    });
  },
);
