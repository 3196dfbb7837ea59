/** The simulator's options, checked and with defaults applied. */
import { BUNDLED_TOKENIZER_MODEL, bundledTokenizerPath } from '../shared/index.js';
import { type FaultConfig, validateFaults } from './faults.js';
import { DEFAULT_OUTPUT_LENGTH, OUTPUT_MODES, type OutputLengthSpec, type OutputMode } from './output-model.js';
import { type ResolvedSpeculative, resolveSpeculative } from './speculative.js';
import { type ResolvedToolCalls, resolveToolCalls } from './tool-calls.js';
import { SIM_VERSIONS, type SimVersion, type SimulatorOptions } from './types.js';

export interface ResolvedOptions {
  host: string;
  port: number;
  seed: number;
  timeScale: number;
  maxRunningRequests: number;
  maxQueuedRequests: number | undefined;
  contextLength: number;
  singleRequestTokensPerSec: number;
  peakTokensPerSec: number;
  prefillTokensPerSec: number;
  declineAboveBatch: number | undefined;
  declinePerRequest: number;
  outputLength: OutputLengthSpec;
  /** How completions are written (output-model.ts); default `random`. */
  output: OutputMode;
  tokenizerPath: string;
  modelPath: string;
  version: SimVersion;
  /** When set, every route but /health*, /metrics and /_sim/* needs `Authorization: Bearer <apiKey>`. */
  apiKey: string | undefined;
  faults: Partial<FaultConfig>;
  /** Speculative decoding (EAGLE3), or undefined without it. */
  speculative: ResolvedSpeculative | undefined;
  /** How prompts that offer tools are answered (tool-calls.ts). */
  toolCalls: ResolvedToolCalls;
  /** `/server_info` carries the announcement (announce.ts). */
  announce: boolean;
}

function positive(name: string, value: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw new RangeError(`simulator option ${name} must be a positive number, got ${String(value)}`);
  }
  return value;
}

function positiveInt(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 1) {
    throw new RangeError(`simulator option ${name} must be a positive integer, got ${String(value)}`);
  }
  return value;
}

export function resolveOptions(o: SimulatorOptions): ResolvedOptions {
  const version = o.version ?? '0.5.4';
  if (!SIM_VERSIONS.includes(version)) {
    throw new RangeError(`simulator option version must be one of ${SIM_VERSIONS.join(', ')}, got ${String(version)}`);
  }
  const port = o.port ?? 0;
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new RangeError(`simulator option port is invalid: ${port}`);
  const outputLength = { ...DEFAULT_OUTPUT_LENGTH, ...o.outputLength };
  positive('outputLength.mean', outputLength.mean);
  if (!['lognormal', 'fixed', 'uniform'].includes(outputLength.distribution)) {
    throw new RangeError(`simulator option outputLength.distribution is invalid: ${String(outputLength.distribution)}`);
  }
  const output = o.output ?? 'random';
  if (!OUTPUT_MODES.includes(output)) {
    throw new RangeError(`simulator option output must be one of ${OUTPUT_MODES.join(', ')}, got ${String(output)}`);
  }
  return {
    host: o.host ?? '127.0.0.1',
    port,
    seed: o.seed ?? 0,
    timeScale: positive('timeScale', o.timeScale ?? 1),
    maxRunningRequests: positiveInt('maxRunningRequests', o.maxRunningRequests ?? 64),
    maxQueuedRequests:
      o.maxQueuedRequests === undefined ? undefined : positiveInt('maxQueuedRequests', o.maxQueuedRequests),
    contextLength: positiveInt('contextLength', o.contextLength ?? 32768),
    singleRequestTokensPerSec: positive('singleRequestTokensPerSec', o.singleRequestTokensPerSec ?? 80),
    peakTokensPerSec: positive('peakTokensPerSec', o.peakTokensPerSec ?? 2500),
    prefillTokensPerSec: positive('prefillTokensPerSec', o.prefillTokensPerSec ?? 20000),
    declineAboveBatch:
      o.declineAboveBatch === undefined ? undefined : positiveInt('declineAboveBatch', o.declineAboveBatch),
    declinePerRequest: positive('declinePerRequest', o.declinePerRequest ?? 0.01),
    outputLength,
    output,
    tokenizerPath: o.tokenizerPath ?? bundledTokenizerPath(),
    modelPath: o.modelPath ?? BUNDLED_TOKENIZER_MODEL,
    apiKey: resolveApiKey(o.apiKey),
    version,
    faults: validateFaults(o.faults ?? {}),
    speculative: o.speculative === undefined ? undefined : resolveSpeculative(o.speculative),
    toolCalls: resolveToolCalls(o.toolCalls),
    announce: o.announce ?? true,
  };
}

function resolveApiKey(key: string | undefined): string | undefined {
  if (key === undefined) return undefined;
  if (typeof key !== 'string' || key === '' || /[\r\n]/.test(key)) {
    throw new RangeError('simulator option apiKey must be a non-empty string without line breaks');
  }
  return key;
}
