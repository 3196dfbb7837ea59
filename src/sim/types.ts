import type { FaultConfig } from './faults.js';
import type { OutputLengthSpec, OutputMode } from './output-model.js';
import type { SpeculativeOptions } from './speculative.js';
import type { ToolCallOptions } from './tool-calls.js';

export type { FaultConfig } from './faults.js';

/** SGLang releases whose response shapes the simulator reproduces. */
export const SIM_VERSIONS = ['0.5.4', '0.5.2rc1', '0.4.10'] as const;
export type SimVersion = (typeof SIM_VERSIONS)[number];

export interface SimulatorOptions {
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0: a free port. */
  port?: number;
  /** Default 0; outputs are deterministic for (seed, rid, prompt length). */
  seed?: number;
  /** Default 1; 100 = simulated time runs 100x faster than wall time. */
  timeScale?: number;
  /** Default 64; beyond it requests queue (SGLang never rejects for load by default). */
  maxRunningRequests?: number;
  /** When set, 503 "The request queue is full." once this many requests wait. */
  maxQueuedRequests?: number;
  /** Default 32768. */
  contextLength?: number;
  /** Decode speed of one request alone, tokens per second; default 80. */
  singleRequestTokensPerSec?: number;
  /** Total decode throughput ceiling at full batch, tokens per second; default 2500. */
  peakTokensPerSec?: number;
  /** Prefill speed (prompt tokens minus cached prefix), tokens per second; default 20000. */
  prefillTokensPerSec?: number;
  /**
   * Beyond this many requests decoding, total throughput falls (a server short of KV cache or
   * memory bandwidth): T(B) / (1 + declinePerRequest * (B - declineAboveBatch)). Default: never.
   */
  declineAboveBatch?: number;
  /** Default 0.01. */
  declinePerRequest?: number;
  /** Completion length distribution; default lognormal, mean 2700, sigma 0.8. */
  outputLength?: OutputLengthSpec;
  /**
   * Default `random`: ordinary token ids drawn one by one. `text`: composed text encoded once
   * with the tokenizer and cut to the drawn length (canonical ids, as a real model's).
   */
  output?: OutputMode;
  /** Tokenizer folder; default the bundled Qwen3 tokenizer. */
  tokenizerPath?: string;
  /** Reported as model_path and model id; default "Qwen/Qwen3-8B". */
  modelPath?: string;
  /** Response shape profile; default '0.5.4'. */
  version?: SimVersion;
  /**
   * SGLang's `--api-key`: every route but /health*, /metrics and /_sim/* then needs
   * `Authorization: Bearer <apiKey>`, else 401 `{"error":"Unauthorized"}`.
   */
  apiKey?: string;
  faults?: Partial<FaultConfig>;
  /**
   * Speculative decoding as SGLang's `--speculative-algorithm EAGLE3` (speculative.ts,
   * docs/simulator.md): completions come in verify steps, `meta_info` carries the `spec_*`
   * counters, /server_info the `speculative_*` settings. Default: none.
   */
  speculative?: SpeculativeOptions | undefined;
  /**
   * Tool calls (tool-calls.ts, docs/simulator.md): a prompt that offers tools is answered, as an
   * agent's plan says, with calls in the chat template's format, perturbed at these rates.
   * Default: probability 0.98, parallel 0.2, divergent 0.04, malformed 0.02; `{probability: 0}`
   * turns them off.
   */
  toolCalls?: ToolCallOptions;
  /**
   * Default true: `/server_info` says this is the simulator (announce.ts, `tokenmill_simulator`:
   * what it imitates and the acceptance it was configured with), a field real SGLang never sends.
   * False: the simulator passes for SGLang.
   */
  announce?: boolean;
}

export interface SimRequestRecord {
  rid: string;
  route: string;
  /** Wall clock (epoch ms) when the request arrived. */
  receivedAtMs: number;
  promptTokens: number;
  maxNewTokens: number;
}

export interface SimStats {
  /** Generation requests (generate + chat) received, counting each batch item. */
  requestsReceived: number;
  requests: SimRequestRecord[];
  /** Finished on their own (stop or length) and answered. */
  completed: number;
  /** Ended by /abort_request, a client disconnect or an outage. */
  aborted: number;
  /** Answered with an error (400, injected 500/503, dropped, malformed). */
  failed: number;
  running: number;
  queued: number;
  maxRunningObserved: number;
  /** Tokens decoded, partial work of aborted requests included (as sglang:generation_tokens_total). */
  outputTokensTotal: number;
  /** Time-weighted mean of running requests since the last reset (wall ms). */
  occupancy: { meanRunning: number; windowMs: number };
}

export interface SimulatorHandle {
  url: string;
  port: number;
  setFaults(f: Partial<FaultConfig>): void;
  clearFaults(): void;
  /**
   * Closes the listener and every open socket now (clients get ECONNREFUSED / reset), and
   * listens again on the same port after `durationMs` (wall). Resolves once it is down.
   */
  outage(durationMs: number): Promise<void>;
  stats(): SimStats;
  resetStats(): void;
  stop(): Promise<void>;
}
