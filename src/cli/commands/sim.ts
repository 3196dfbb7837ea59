import { type Command, InvalidArgumentError, Option } from 'commander';

import { TOOL_CALL_FORMATS, type ToolCallFormat } from '../../shared/index.js';

import {
  DEFAULT_TOOL_CALL_RATES,
  OUTPUT_MODES,
  SIM_VERSIONS,
  type OutputMode,
  type SimVersion,
  type SimulatorOptions,
  SPECULATIVE_ALGORITHMS,
  type SpeculativeFlags,
  speculativeFromFlags,
  startSimulator,
} from '../../sim/index.js';

interface SimCommandOptions extends SpeculativeFlags {
  port: number;
  host: string;
  maxRunning: number;
  maxQueued?: number;
  timeScale: number;
  seed: number;
  contextLength: number;
  singleTokensPerSec: number;
  peakTokensPerSec: number;
  prefillTokensPerSec: number;
  meanOutputTokens: number;
  outputDistribution: 'lognormal' | 'fixed' | 'uniform';
  outputSigma?: number;
  minOutputTokens?: number;
  maxOutputTokens?: number;
  output: OutputMode;
  tokenizer?: string;
  modelPath: string;
  version: SimVersion;
  errorRate: number;
  burst503: number;
  hangRate: number;
  dropRate: number;
  malformedRate: number;
  unhealthy: boolean;
  firstTry503Rate: number;
  apiKey?: string;
  /** Commander's `--no-announce`: false leaves the simulator's announcement out of /server_info. */
  announce?: boolean;
  toolCallProbability?: number;
  toolCallParallel?: number;
  toolCallDivergent?: number;
  toolCallMalformed?: number;
  toolCallFormat?: ToolCallFormat;
  toolCallsDataset?: string[];
}

/** `--tool-calls-dataset <name>=<probability>`, repeated: the probability of calls per dataset. */
function toolCallsPerDataset(entries: readonly string[] | undefined): Record<string, { probability: number }> {
  const out: Record<string, { probability: number }> = {};
  for (const entry of entries ?? []) {
    const eq = entry.lastIndexOf('=');
    const probability = Number(entry.slice(eq + 1));
    if (eq <= 0 || entry.slice(eq + 1).trim() === '' || !(probability >= 0 && probability <= 1))
      throw new RangeError(`--tool-calls-dataset expects <dataset>=<probability in [0, 1]>, got "${entry}"`);
    out[entry.slice(0, eq)] = { probability };
  }
  return out;
}

function numberArg(kind: 'int' | 'positive' | 'positive-int' | 'rate' | 'nonneg-int' | 'nonneg') {
  return (value: string): number => {
    const n = Number(value);
    const ok =
      Number.isFinite(n) &&
      (kind === 'int'
        ? Number.isInteger(n)
        : kind === 'nonneg-int'
          ? Number.isInteger(n) && n >= 0
          : kind === 'nonneg'
            ? n >= 0
            : kind === 'positive-int'
              ? Number.isInteger(n) && n > 0
              : kind === 'positive'
                ? n > 0
                : n >= 0 && n <= 1);
    if (!ok) {
      const what = {
        int: 'an integer',
        'nonneg-int': 'a non-negative integer',
        nonneg: 'a non-negative number',
        'positive-int': 'a positive integer',
        positive: 'a positive number',
        rate: 'a number in [0, 1]',
      }[kind];
      throw new InvalidArgumentError(`expected ${what}, got "${value}"`);
    }
    return n;
  };
}

/** Simulator options from the command line (RangeError for a wrong `--speculative-*` flag). Exported for tests. */
export function simOptionsFrom(opts: SimCommandOptions): SimulatorOptions {
  const speculative = speculativeFromFlags({
    speculativeAlgorithm: opts.speculativeAlgorithm,
    speculativeDraftModelPath: opts.speculativeDraftModelPath,
    speculativeNumSteps: opts.speculativeNumSteps,
    speculativeEagleTopk: opts.speculativeEagleTopk,
    speculativeNumDraftTokens: opts.speculativeNumDraftTokens,
    speculativeAcceptance: opts.speculativeAcceptance,
    speculativeDataset: opts.speculativeDataset,
    speculativeDraftOverhead: opts.speculativeDraftOverhead,
    speculativeDflashBlockSize: opts.speculativeDflashBlockSize,
    speculativeBlockVerifyCost: opts.speculativeBlockVerifyCost,
  });
  return {
    ...(speculative === undefined ? {} : { speculative }),
    host: opts.host,
    port: opts.port,
    seed: opts.seed,
    timeScale: opts.timeScale,
    maxRunningRequests: opts.maxRunning,
    ...(opts.maxQueued === undefined ? {} : { maxQueuedRequests: opts.maxQueued }),
    contextLength: opts.contextLength,
    singleRequestTokensPerSec: opts.singleTokensPerSec,
    peakTokensPerSec: opts.peakTokensPerSec,
    prefillTokensPerSec: opts.prefillTokensPerSec,
    outputLength: {
      distribution: opts.outputDistribution,
      mean: opts.meanOutputTokens,
      ...(opts.outputSigma === undefined ? {} : { sigma: opts.outputSigma }),
      ...(opts.minOutputTokens === undefined ? {} : { min: opts.minOutputTokens }),
      ...(opts.maxOutputTokens === undefined ? {} : { max: opts.maxOutputTokens }),
    },
    output: opts.output,
    ...(opts.tokenizer === undefined ? {} : { tokenizerPath: opts.tokenizer }),
    modelPath: opts.modelPath,
    version: opts.version,
    ...(opts.apiKey === undefined ? {} : { apiKey: opts.apiKey }),
    ...(opts.announce === false ? { announce: false } : {}),
    toolCalls: {
      ...(opts.toolCallProbability === undefined ? {} : { probability: opts.toolCallProbability }),
      ...(opts.toolCallParallel === undefined ? {} : { parallel: opts.toolCallParallel }),
      ...(opts.toolCallDivergent === undefined ? {} : { divergent: opts.toolCallDivergent }),
      ...(opts.toolCallMalformed === undefined ? {} : { malformed: opts.toolCallMalformed }),
      ...(opts.toolCallFormat === undefined ? {} : { format: opts.toolCallFormat }),
      ...(opts.toolCallsDataset === undefined ? {} : { perDataset: toolCallsPerDataset(opts.toolCallsDataset) }),
    },
    faults: {
      errorRate: opts.errorRate,
      burst503: opts.burst503,
      hangRate: opts.hangRate,
      dropRate: opts.dropRate,
      malformedRate: opts.malformedRate,
      unhealthy: opts.unhealthy,
      firstTry503Rate: opts.firstTry503Rate,
    },
  };
}

/** `tokenmill sim`: an SGLang simulator (HTTP API, continuous-batching load model, fault injection). */
export function registerSimCommand(program: Command): void {
  program
    .command('sim')
    .description(
      'run an SGLang simulator: the same HTTP API, a continuous-batching load model, injectable faults (admin API under /_sim/)',
    )
    .option('--port <n>', 'port to listen on (0 = a free port)', numberArg('nonneg-int'), 30000)
    .option('--host <host>', 'address to listen on', '127.0.0.1')
    .option(
      '--max-running <n>',
      'requests decoding together (--max-running-requests); more wait in the queue',
      numberArg('positive-int'),
      64,
    )
    .option(
      '--max-queued <n>',
      'answer 503 "The request queue is full." beyond this many waiting requests',
      numberArg('positive-int'),
    )
    .option('--time-scale <x>', 'simulated seconds per wall second (100 = 100x faster)', numberArg('positive'), 1)
    .option('--seed <n>', 'seed of the generated outputs and the faults', numberArg('int'), 0)
    .option('--context-length <n>', "the model's context length in tokens", numberArg('positive-int'), 32768)
    .option('--single-tokens-per-sec <x>', 'decode speed of one request alone', numberArg('positive'), 80)
    .option('--peak-tokens-per-sec <x>', 'total decode throughput at a full batch', numberArg('positive'), 2500)
    .option('--prefill-tokens-per-sec <x>', 'prefill speed (uncached prompt tokens)', numberArg('positive'), 20000)
    .option('--mean-output-tokens <n>', 'mean completion length', numberArg('positive'), 2700)
    .addOption(
      new Option('--output-distribution <name>', 'completion length distribution')
        .choices(['lognormal', 'fixed', 'uniform'])
        .default('lognormal'),
    )
    .option('--output-sigma <x>', 'lognormal sigma (default 0.8)', numberArg('positive'))
    .option('--min-output-tokens <n>', 'shortest completion', numberArg('positive-int'))
    .option('--max-output-tokens <n>', 'longest completion (before max_new_tokens)', numberArg('positive-int'))
    .addOption(
      new Option(
        '--output <mode>',
        'what completions hold: text (composed text encoded once, canonical ids as a real model writes) or random (random ordinary ids)',
      )
        .choices([...OUTPUT_MODES])
        .default('text'),
    )
    .option(
      '--tokenizer <dir>',
      'tokenizer folder (tokenizer.json + tokenizer_config.json); default the bundled Qwen3 tokenizer',
    )
    .option('--model-path <name>', 'model name reported as model_path and model id', 'Qwen/Qwen3-8B')
    .addOption(
      new Option('--version <v>', 'SGLang version whose response shapes to reproduce')
        .choices([...SIM_VERSIONS])
        .default('0.5.4'),
    )
    .option('--error-rate <x>', 'fraction of generation requests answered 500', numberArg('rate'), 0)
    .option('--burst-503 <n>', 'answer the next N generation requests 503', numberArg('nonneg-int'), 0)
    .option('--hang-rate <x>', 'fraction of generation requests never answered', numberArg('rate'), 0)
    .option('--drop-rate <x>', 'fraction of generation requests whose connection is reset', numberArg('rate'), 0)
    .option(
      '--malformed-rate <x>',
      'fraction of generation requests answered with truncated JSON',
      numberArg('rate'),
      0,
    )
    .option('--unhealthy', '/health and /health_generate answer 503', false)
    .option(
      '--no-announce',
      'leave tokenmill_simulator out of /server_info: the simulator passes for SGLang (an eval then labels its figures measured)',
    )
    .option(
      '--first-try-503-rate <x>',
      'fraction of sample ids whose first request is answered 503 "The request queue is full."',
      numberArg('rate'),
      0,
    )
    .option(
      '--api-key <key>',
      "require `Authorization: Bearer <key>` as SGLang's --api-key does (health and metrics stay open)",
    )
    .addOption(
      new Option(
        '--speculative-algorithm <name>',
        'decode speculatively as SGLang does with this algorithm (meta_info gets spec_* counters)',
      ).choices([...SPECULATIVE_ALGORITHMS]),
    )
    .option('--speculative-draft-model-path <path>', 'the drafter, reported in /server_info')
    .option('--speculative-num-steps <n>', 'drafts per verify step (default 3)', numberArg('positive-int'))
    .option('--speculative-eagle-topk <n>', 'draft tree width; only 1 is simulated', numberArg('positive-int'))
    .option(
      '--speculative-num-draft-tokens <n>',
      'set to num-steps + 1 with topk 1, as SGLang does',
      numberArg('positive-int'),
    )
    .option(
      '--speculative-acceptance <x>',
      'the drafter: per-position acceptance rates (0.8,0.6,0.4) or a mean accept length (2.4); default 0.7 each',
    )
    .option(
      '--speculative-dataset <name=x>',
      'acceptance for requests whose rid names this dataset (eval:<name>:… or <name>/…); repeatable',
      (value: string, previous: string[] | undefined) => [...(previous ?? []), value],
    )
    .option(
      '--speculative-draft-overhead <x>',
      'cost of drafting and verifying a step beyond a plain decode step (default 0.25; DFLASH 0.1, the block verify apart)',
      numberArg('nonneg'),
    )
    .option(
      '--speculative-dflash-block-size <n>',
      'DFLASH: slots per drafted block, drafts one fewer (default 16)',
      numberArg('positive-int'),
    )
    .option(
      '--speculative-block-verify-cost <x>',
      'DFLASH: cost of verifying one block slot, as a share of a decode step (default 0.02)',
      numberArg('nonneg'),
    )
    .option(
      '--tool-call-probability <x>',
      `how often a prompt that offers tools is answered with the calls its agent plan says (default ${DEFAULT_TOOL_CALL_RATES.probability}; 0: never)`,
      numberArg('rate'),
    )
    .option(
      '--tool-call-parallel <x>',
      `share of the plan's rounds that make 2-3 calls at once (default ${DEFAULT_TOOL_CALL_RATES.parallel})`,
      numberArg('rate'),
    )
    .option(
      '--tool-call-divergent <x>',
      `share of answers with calls where one names another tool, or one not offered (default ${DEFAULT_TOOL_CALL_RATES.divergent})`,
      numberArg('rate'),
    )
    .option(
      '--tool-call-malformed <x>',
      `share of answers with calls where one's arguments are not JSON (default ${DEFAULT_TOOL_CALL_RATES.malformed})`,
      numberArg('rate'),
    )
    .addOption(
      new Option(
        '--tool-call-format <name>',
        "the format calls are written in (default: the chat template's: <tool_call> → hermes, …)",
      ).choices([...TOOL_CALL_FORMATS]),
    )
    .option(
      '--tool-calls-dataset <name=x>',
      'tool-call probability for requests whose rid names this dataset; repeatable',
      (value: string, previous: string[] | undefined) => [...(previous ?? []), value],
    )
    .action(async (opts: SimCommandOptions, cmd: Command) => {
      let sim: Awaited<ReturnType<typeof startSimulator>>;
      try {
        sim = await startSimulator(simOptionsFrom(opts));
      } catch (e: unknown) {
        // Option values the simulator rejects (e.g. fault rates adding up past 1).
        if (e instanceof RangeError) cmd.error(`tokenmill sim: ${e.message}`);
        throw e;
      }
      process.stdout.write(`SGLang simulator listening on ${sim.url}\n`);
      await new Promise<void>((resolve) => {
        const shutdown = (signal: NodeJS.Signals): void => {
          process.off('SIGINT', shutdown);
          process.off('SIGTERM', shutdown);
          process.stderr.write(`tokenmill sim: ${signal}, stopping\n`);
          // Stop taking requests, drop those in flight, close the listener.
          sim.stop().then(resolve, resolve);
        };
        process.on('SIGINT', shutdown);
        process.on('SIGTERM', shutdown);
      });
    });
}
