/**
 * `tokenmill prepare`: every dataset with a `source` gets its prompt file (`{"id","messages"}`
 * JSONL at the dataset's `prompts`), in config order, with `prepare-report.json` next to the
 * run's other files of the dataset and a fingerprint next to the prompt file. A dataset whose
 * sources and settings are unchanged since its last `prepare` keeps its file as it is.
 */
import { join, resolve } from 'node:path';
import type { Redis } from 'ioredis';
import {
  AppError,
  loadConfiguredTokenizer,
  logger as componentLogger,
  runDir,
  writeFileAtomic,
  type ChatTokenizer,
  type Config,
  type DatasetConfig,
  type Logger,
  type PromptSource,
  type RunKeys,
} from '../../shared/index.js';
import { resolveEvalHoldout } from '../eval-holdout.js';
import { keptHashesOf, prepareDataset, type KeptBy } from './prepare-dataset.js';
import {
  fingerprintInputs,
  fingerprintOf,
  promptFileMatches,
  readStoredFingerprint,
  writeStoredFingerprint,
  type FingerprintInputs,
  type StoredFingerprint,
} from './prepare-fingerprint.js';
import type { PrepareCounts, PrepareReport } from './prepare-report.js';
import type { Hash64Set } from './prompt-hash.js';
import { checkRunPrompts, recordPrepared } from './prepare-run-guard.js';
import { openSource } from './source.js';
import type { OpenedSource } from './source-types.js';

/** How one dataset's `prepare` went. */
export interface DatasetPrepareOutcome {
  dataset: string;
  /** `prepared`: written now; `unchanged`: sources and settings as last time, the file kept as it was. */
  outcome: 'prepared' | 'unchanged';
  prompts: string;
  report: string;
  promptsSha256: string;
  counts: PrepareCounts;
  ms: number;
  format: string;
  detectedFrom?: string;
  notes?: string[];
  /** With `evalHoldout`: prompts of the file held out of generation, and the file that holds them. */
  evalHeldOut?: number;
  evalPrompts?: string;
}

export interface PrepareSourcesOptions {
  config: Config;
  /** The run's tokenizer when already loaded; otherwise loaded from the config when a `maxPromptTokens` needs it. */
  tokenizer?: ChatTokenizer;
  /**
   * The model's context length (default: `sglang.contextLength`): with it, a `turns: all`
   * dataset's report counts the conversations that would not fit whole (`overContext`).
   */
  contextLength?: number;
  /** The run's Redis: the numbers for `status`, and the refusal to change a run's prompts under it. */
  run?: { redis: Redis; keys: RunKeys };
  /** Opens a source; default {@link openSource}. */
  open?: (source: PromptSource) => Promise<OpenedSource>;
  /** Called as each dataset is done. */
  onDataset?: (outcome: DatasetPrepareOutcome) => void;
  /** Stops the prepare (a `CancelledError`), leaving every prompt file as it was. */
  signal?: AbortSignal;
  /** Called about every 10 s while a dataset is prepared, with its counts so far. */
  onProgress?: (dataset: string, counts: Readonly<PrepareCounts>) => void;
  logger?: Logger;
}

type SourcedDataset = DatasetConfig & { source: PromptSource; prompts: string };

/** The datasets `prepare` writes the prompt file of, in config order. */
export function sourcedDatasets(config: Pick<Config, 'datasets'>): SourcedDataset[] {
  return config.datasets.filter((d): d is SourcedDataset => d.source !== undefined && d.prompts !== undefined);
}

/** `<output.dir>/<run>/<dataset>/prepare-report.json`. */
export function prepareReportPath(config: Pick<Config, 'run' | 'output'>, dataset: string): string {
  return join(runDir(config), dataset, 'prepare-report.json');
}

interface Planned {
  ds: SourcedDataset;
  opened: OpenedSource;
  inputs: FingerprintInputs;
  fingerprint: string;
  stored: StoredFingerprint | undefined;
  unchanged: boolean;
}

/** Prepares every sourced dataset of the config; see the module comment. */
export async function prepareSources(options: PrepareSourcesOptions): Promise<DatasetPrepareOutcome[]> {
  const { config, run } = options;
  const log = options.logger ?? componentLogger('prepare', { run: config.run });
  const datasets = sourcedDatasets(config);
  if (datasets.length === 0) return [];
  const open = options.open ?? openSource;
  const dedupeAcross = config.prepare.dedupeAcross;
  let tokenizer: Promise<ChatTokenizer> | undefined =
    options.tokenizer === undefined ? undefined : Promise.resolve(options.tokenizer);
  const loadTokenizer = (): Promise<ChatTokenizer> => (tokenizer ??= loadConfiguredTokenizer(config));
  if (run !== undefined) await run.redis.hset(run.keys.phases(), 'prepare', 'in_progress');
  try {
    const planned: Planned[] = [];
    for (const ds of datasets) {
      const opened = await openNamed(open, ds, config.datasets.indexOf(ds));
      const maxPromptTokens = ds.source.maxPromptTokens ?? config.prepare.maxPromptTokens;
      const contextLength = options.contextLength ?? config.sglang.contextLength;
      const inputs = await fingerprintInputs({
        dataset: ds.name,
        source: ds.source,
        files: opened.files,
        maxPromptTokens,
        dedupeAcross,
        tokenizer: config.tokenizer,
        after: planned.map((p) => p.fingerprint),
        turns: ds.turns,
        templateKwargs: ds.chatTemplateKwargs,
        contextCheck: contextLength === undefined ? undefined : { contextLength, maxNewTokens: ds.maxNewTokens },
      });
      const fingerprint = fingerprintOf(inputs);
      const stored = await readStoredFingerprint(ds.prompts);
      const unchanged = stored?.fingerprint === fingerprint && (await promptFileMatches(ds.prompts, stored));
      planned.push({ ds, opened, inputs, fingerprint, stored, unchanged });
    }
    // With `dedupeAcross`, the datasets before the last one to prepare hand it what they kept.
    const lastToPrepare = planned.reduce((last, p, i) => (p.unchanged ? last : i), -1);
    const keptBefore: KeptBy[] = [];
    const outcomes: DatasetPrepareOutcome[] = [];
    for (const [i, p] of planned.entries()) {
      const needKept = dedupeAcross && i < lastToPrepare;
      const outcome =
        p.unchanged && p.stored !== undefined
          ? await keepUnchanged(p, p.stored, config, run, log)
          : await prepareOne(p, config, {
              log,
              run,
              keptBefore,
              recordKept: needKept,
              loadTokenizer,
              onProgress: options.onProgress,
              signal: options.signal,
            });
      if (needKept) keptBefore.push({ dataset: p.ds.name, hashes: outcome.kept ?? (await keptHashesOf(p.ds.prompts)) });
      const result: DatasetPrepareOutcome = { ...outcome };
      delete (result as OutcomeWithKept).kept;
      log.info({ dataset: p.ds.name, outcome: result.outcome, ...result.counts, ms: result.ms }, 'dataset prepared');
      outcomes.push(result);
      options.onDataset?.(result);
    }
    if (run !== undefined) await run.redis.hset(run.keys.phases(), 'prepare', 'completed');
    return outcomes;
  } catch (e: unknown) {
    if (run !== undefined) await run.redis.hset(run.keys.phases(), 'prepare', 'failed').catch(() => undefined);
    throw e;
  }
}

/** Opens a dataset's source; what goes wrong names the dataset and its config path, and a source that is its own prompt file is refused. */
async function openNamed(
  open: (source: PromptSource) => Promise<OpenedSource>,
  ds: SourcedDataset,
  index: number,
): Promise<OpenedSource> {
  const where = `dataset "${ds.name}" (datasets[${index}].source)`;
  let opened: OpenedSource;
  try {
    opened = await open(ds.source);
  } catch (e: unknown) {
    if (e instanceof AppError) throw new AppError(`${where}: ${e.message}`, { cause: e });
    throw e;
  }
  if (opened.files.some((f) => resolve(f) === resolve(ds.prompts))) {
    throw new AppError(
      `${where}: the source ${ds.prompts} is also the dataset's prompt file (datasets[${index}].prompts); prepare would overwrite it — set prompts to another file, or drop it to use <output.dir>/<run>/${ds.name}/prompts.jsonl`,
    );
  }
  return opened;
}

type OutcomeWithKept = DatasetPrepareOutcome & { kept?: Hash64Set | undefined };

function describeOpened(opened: OpenedSource): Pick<DatasetPrepareOutcome, 'format' | 'detectedFrom' | 'notes'> {
  return {
    format: opened.format,
    ...(opened.detectedFrom === undefined ? {} : { detectedFrom: opened.detectedFrom }),
    ...(opened.notes === undefined || opened.notes.length === 0 ? {} : { notes: opened.notes }),
  };
}

async function keepUnchanged(
  p: Planned,
  stored: StoredFingerprint,
  config: Config,
  run: PrepareSourcesOptions['run'],
  log: Logger,
): Promise<OutcomeWithKept> {
  if (run !== undefined) {
    await checkRunPrompts({ ...run, config }, p.ds.name, p.ds.prompts, stored.prompts.sha256);
    await recordPrepared(run.redis, run.keys, p.ds.name, stored.prompts.sha256, stored.counts);
  }
  const holdout = await evalHoldoutOf(p.ds, config, run, log);
  return {
    dataset: p.ds.name,
    outcome: 'unchanged',
    prompts: p.ds.prompts,
    report: prepareReportPath(config, p.ds.name),
    promptsSha256: stored.prompts.sha256,
    counts: stored.counts,
    ms: stored.ms,
    ...describeOpened(p.opened),
    ...holdout,
  };
}

/** The dataset's eval split (`evalHoldout`), made now from its new prompt file or read back. */
async function evalHoldoutOf(
  ds: SourcedDataset,
  config: Config,
  run: PrepareSourcesOptions['run'],
  log: Logger,
): Promise<Pick<DatasetPrepareOutcome, 'evalHeldOut' | 'evalPrompts'>> {
  const holdout = await resolveEvalHoldout({
    ds,
    promptsFile: ds.prompts,
    runDir: runDir(config),
    log,
    ...(run === undefined ? {} : { run }),
  });
  return holdout === undefined ? {} : { evalHeldOut: holdout.count, evalPrompts: holdout.file };
}

async function prepareOne(
  p: Planned,
  config: Config,
  ctx: {
    log: Logger;
    run: PrepareSourcesOptions['run'];
    keptBefore: readonly KeptBy[];
    recordKept: boolean;
    loadTokenizer: () => Promise<ChatTokenizer>;
    onProgress: PrepareSourcesOptions['onProgress'];
    signal: AbortSignal | undefined;
  },
): Promise<OutcomeWithKept> {
  const started = Date.now();
  const { ds, opened } = p;
  const maxPromptTokens = p.inputs.maxPromptTokens ?? undefined;
  const run = ctx.run;
  const result = await prepareDataset({
    dataset: ds.name,
    rows: opened.rows(),
    promptsFile: ds.prompts,
    maxPromptTokens,
    turns: ds.turns,
    templateKwargs: ds.chatTemplateKwargs,
    contextCheck: p.inputs.contextCheck,
    tokenizer: ctx.loadTokenizer,
    limit: ds.source.limit,
    shuffleSeed: ds.source.shuffle?.seed,
    keptBefore: ctx.keptBefore,
    recordKept: ctx.recordKept,
    beforeCommit:
      run === undefined ? undefined : (sha) => checkRunPrompts({ ...run, config }, ds.name, ds.prompts, sha),
    onProgress: ctx.onProgress === undefined ? undefined : (c) => ctx.onProgress?.(ds.name, c),
    signal: ctx.signal,
  });
  const ms = Date.now() - started;
  await writeStoredFingerprint(result.written, {
    fingerprint: p.fingerprint,
    counts: result.counts,
    ms,
    inputs: p.inputs,
  });
  const holdout = await evalHoldoutOf(ds, config, run, ctx.log);
  const reportFile = prepareReportPath(config, ds.name);
  const report: PrepareReport = {
    dataset: ds.name,
    outcome: 'prepared',
    source: {
      path: ds.source.path,
      format: opened.format,
      ...(opened.detectedFrom === undefined ? {} : { detectedFrom: opened.detectedFrom }),
      files: opened.files,
    },
    prompts: ds.prompts,
    promptsSha256: result.written.sha256,
    fingerprint: p.fingerprint,
    maxPromptTokens: maxPromptTokens ?? null,
    ...(p.inputs.contextCheck === undefined ? {} : { contextCheck: p.inputs.contextCheck }),
    limit: ds.source.limit ?? null,
    shuffleSeed: ds.source.shuffle?.seed ?? null,
    dedupeAcross: config.prepare.dedupeAcross,
    counts: result.counts,
    examples: result.examples,
    ...(holdout.evalHeldOut === undefined ? {} : { evalHeldOut: holdout.evalHeldOut }),
    ms,
  };
  await writeFileAtomic(reportFile, `${JSON.stringify(report, null, 2)}\n`);
  if (run !== undefined) await recordPrepared(run.redis, run.keys, ds.name, result.written.sha256, result.counts);
  return {
    dataset: ds.name,
    outcome: 'prepared',
    prompts: ds.prompts,
    report: reportFile,
    promptsSha256: result.written.sha256,
    counts: result.counts,
    ms,
    ...describeOpened(opened),
    ...holdout,
    kept: result.kept,
  };
}
