/**
 * The prompts an evaluation sends: per dataset, its held-out prompts
 * (`<run dir>/<dataset>/eval-prompts.jsonl`, written by `datasets[].evalHoldout`), or one set from
 * `eval.prompts`; parsed with the producer's prompt-line parser and rendered as the producer
 * renders them (the tokenizer's chat template with the record's tool schemas and the dataset's
 * `chatTemplateKwargs`, the generation prompt added; with `turns: all` the history before the
 * first turn).
 */
import path from 'node:path';
import {
  conversationTurns,
  exists,
  readPromptFile,
  turnHistory,
  type ChatTokenizer,
  type Config,
  type DatasetConfig,
  type PromptRecord,
} from '../../shared/index.js';

/** `<run dir>/<dataset>/eval-prompts.jsonl`. */
export function heldOutPromptsPath(runDir: string, dataset: string): string {
  return path.join(runDir, dataset, 'eval-prompts.jsonl');
}

/** One prompt, rendered. */
export interface EvalPrompt {
  id: string;
  inputIds: number[];
  maxNewTokens: number;
}

/** The prompts of one dataset (or of `eval.prompts`) and how they are sampled. */
export interface EvalPromptSet {
  /** The dataset's name; for `eval.prompts`, the file's name without `.jsonl`. */
  dataset: string;
  file: string;
  prompts: EvalPrompt[];
  /** Sent as `sampling_params` besides `max_new_tokens`. */
  sampling: Record<string, unknown>;
  /** Lines refused (invalid, duplicate id, unrenderable, longer than the context), with why. */
  rejected: { line: number; reason: string }[];
}

/** What {@link loadPromptSets} found. */
export interface PromptSets {
  sets: EvalPromptSet[];
  /** Datasets without held-out prompts, and why. */
  skipped: { dataset: string; reason: string }[];
}

/** What turn 1 is rendered from, as the producer does: the record's chat, or with `turns: all` the history before its first turn. */
function firstTurnMessages(turns: DatasetConfig['turns'], rec: PromptRecord): PromptRecord['messages'] {
  if (turns !== 'all') return rec.messages;
  const t = conversationTurns(rec.messages);
  if (typeof t === 'string') return rec.messages;
  return turnHistory(rec.messages, t, 1, []);
}

/** Reads, deduplicates, renders and caps one prompt file. */
async function loadSet(
  dataset: string,
  file: string,
  ds: Pick<DatasetConfig, 'turns' | 'chatTemplateKwargs'>,
  opts: {
    tokenizer: ChatTokenizer;
    maxPrompts: number;
    maxNewTokens: number;
    contextLength: number | undefined;
    sampling: Record<string, unknown>;
  },
): Promise<EvalPromptSet> {
  const rejected: EvalPromptSet['rejected'] = [];
  const records: PromptRecord[] = [];
  for await (const line of readPromptFile(file, undefined, { turns: ds.turns })) {
    if (!line.ok) {
      rejected.push({ line: line.reject.line, reason: line.reject.reason });
      continue;
    }
    records.push(line.record);
    if (records.length >= opts.maxPrompts) break;
  }
  const encoded = await opts.tokenizer.encodePrompts(
    records.map((r) => ({ messages: firstTurnMessages(ds.turns, r), tools: r.tools })),
    ds.chatTemplateKwargs === undefined ? {} : { templateKwargs: ds.chatTemplateKwargs },
  );
  const prompts: EvalPrompt[] = [];
  const ctx = opts.contextLength;
  records.forEach((rec, i) => {
    const ids = encoded[i];
    if (ids === undefined || ids instanceof Error) {
      rejected.push({ line: rec.line, reason: `cannot render the chat template: ${ids?.message ?? 'not tokenized'}` });
      return;
    }
    if (ctx !== undefined && ids.length >= ctx) {
      rejected.push({
        line: rec.line,
        reason: `prompt has ${ids.length} tokens; the model's context length is ${ctx}`,
      });
      return;
    }
    const maxNewTokens = ctx === undefined ? opts.maxNewTokens : Math.min(opts.maxNewTokens, ctx - ids.length);
    prompts.push({ id: rec.id, inputIds: ids, maxNewTokens });
  });
  return { dataset, file, prompts, sampling: opts.sampling, rejected };
}

/** The set name of an `eval.prompts` file: its name without `.jsonl`. */
export function promptFileSetName(file: string): string {
  return path.basename(file).replace(/\.jsonl$/, '') || 'prompts';
}

/**
 * The prompt sets of an evaluation: `eval.prompts` as one set, else every prompt dataset's
 * held-out file that exists (the others are listed in `skipped`).
 */
export async function loadPromptSets(
  config: Pick<Config, 'datasets'> & { eval: NonNullable<Config['eval']> },
  runDir: string,
  tokenizer: ChatTokenizer,
  contextLength: number | undefined,
): Promise<PromptSets> {
  const e = config.eval;
  const common = { tokenizer, maxPrompts: e.maxPromptsPerDataset, maxNewTokens: e.maxNewTokens, contextLength };
  if (e.prompts !== undefined) {
    const sampling = e.sampling === 'dataset' ? {} : e.sampling;
    const set = await loadSet(promptFileSetName(e.prompts), e.prompts, { turns: 'last' }, { ...common, sampling });
    return { sets: [set], skipped: [] };
  }
  const sets: EvalPromptSet[] = [];
  const skipped: PromptSets['skipped'] = [];
  for (const ds of config.datasets) {
    if (ds.prompts === undefined) {
      skipped.push({ dataset: ds.name, reason: 'a conversation dataset: nothing is generated for it' });
      continue;
    }
    const file = heldOutPromptsPath(runDir, ds.name);
    if (!(await exists(file))) {
      skipped.push({ dataset: ds.name, reason: `no held-out prompts (${file}; set datasets[].evalHoldout)` });
      continue;
    }
    const sampling: Record<string, unknown> = e.sampling === 'dataset' ? { ...ds.sampling } : e.sampling;
    sets.push(await loadSet(ds.name, file, ds, { ...common, sampling }));
  }
  return { sets, skipped };
}
