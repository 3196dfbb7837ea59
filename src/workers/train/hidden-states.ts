import { lstat, readFile, readdir, realpath, stat, statfs } from 'node:fs/promises';
import path from 'node:path';
import {
  AppError,
  DatasetIndex,
  HIDDEN_STATE_DTYPES,
  describeHiddenStates,
  errorMessage,
  exists,
  formatBytes,
  hiddenStatesFormula,
  isErrno,
  isRecord,
  readDatasetMeta,
  type TrainHiddenStates,
  type TrainPayload,
} from '../../shared/index.js';
import { stepPayload } from './chain.js';

/**
 * Hidden states sized before they are written. A step that declares `hiddenStates` (an
 * extraction step: SpecForge's offline capture, speculators' `generate-offline-data`) writes,
 * for every token of the training dataset, `layers` vectors of the target model's hidden size
 * (EAGLE-3: 4 — SpecForge's `aux_hidden_state` [seq, 3·H] + `hidden_state` [seq, H];
 * speculators' `hidden_states` [seq, 3 + 1, H]) plus the token's id and loss mask:
 *
 *   bytes = tokens × (hidden_size × layers × bytes per element + overheadBytesPerToken)
 *
 * Before the step starts the estimate is set against the file system of its output folder:
 * one smaller than the estimate (+ margin) can never hold it, and the step fails at once; one
 * with too little free space makes the step wait, like `minFreeDiskGiB`, until space frees.
 */

/** What the step will write, and the inputs of the estimate. */
export interface HiddenStatesEstimate {
  step: string;
  stepIndex: number;
  steps: number;
  /** The step's config path, `train.steps[1].hiddenStates`. */
  where: string;
  tokens: number;
  tokensFrom: 'merge index' | 'shard scan';
  dataset: string;
  hiddenSize: number;
  layers: number;
  dtype: keyof typeof HIDDEN_STATE_DTYPES;
  bytesPerElement: number;
  overheadBytesPerToken: number;
  margin: number;
  configFile: string;
  bytes: number;
}

/** The file system of a folder: its mount point (or the folder), total and free bytes. */
export interface DiskSeen {
  path: string;
  totalBytes: number;
  freeBytes: number;
}

/** The estimate's formula: tokens × (hidden size × layers × bytes per element + overhead per token). */
export function hiddenStatesBytes(i: {
  tokens: number;
  hiddenSize: number;
  layers: number;
  bytesPerElement: number;
  overheadBytesPerToken: number;
}): number {
  return i.tokens * (i.hiddenSize * i.layers * i.bytesPerElement + i.overheadBytesPerToken);
}

/** The target model's shape, from its config.json. */
export interface ModelShape {
  configFile: string;
  hiddenSize: number;
  /** `num_hidden_layers`, when the config gives it. */
  numHiddenLayers: number | null;
}

const positive = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v > 0;

/**
 * Reads `hidden_size` (a multimodal config's `text_config.hidden_size`: the language model's
 * states are the ones captured) and `num_hidden_layers` from the model folder's config.json, or
 * from `model` itself when it is a JSON file. `where` is the config path errors name.
 */
export async function readModelShape(model: string, where: string): Promise<ModelShape> {
  let configFile = path.join(model, 'config.json');
  if (model.endsWith('.json')) configFile = model;
  else {
    try {
      if ((await stat(model)).isFile()) configFile = model;
    } catch {
      // a missing folder: reported below, naming its config.json
    }
  }
  let text: string;
  try {
    text = await readFile(configFile, 'utf8');
  } catch (e: unknown) {
    const why = isErrno(e, 'ENOENT') ? 'no such file' : errorMessage(e);
    throw new AppError(
      `${where}.model: cannot read ${configFile}: ${why} (expected the target model's folder, holding its config.json)`,
    );
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e: unknown) {
    throw new AppError(`${where}.model: ${configFile} is not valid JSON: ${errorMessage(e)}`);
  }
  if (!isRecord(parsed)) throw new AppError(`${where}.model: ${configFile} is not a JSON object`);
  const text_config = isRecord(parsed.text_config) ? parsed.text_config : undefined;
  const source = text_config !== undefined && positive(text_config.hidden_size) ? text_config : parsed;
  if (!positive(source.hidden_size)) {
    throw new AppError(
      `${where}.model: ${configFile} has no hidden_size (nor text_config.hidden_size) as a positive integer${source.hidden_size === undefined ? '' : `, got ${JSON.stringify(source.hidden_size)}`}`,
    );
  }
  return {
    configFile,
    hiddenSize: source.hidden_size,
    numHiddenLayers: positive(source.num_hidden_layers) ? source.num_hidden_layers : null,
  };
}

/** Token counts of datasets read by a shard scan, by folder and state.json text (a scan costs a pass). */
const scanned = new Map<string, number>();

/**
 * Total tokens (`num_tokens`) of a training dataset: from its merge index's shard headers
 * (written by every merge, see hf-dataset/merge/id-index.ts), or, for a dataset without them,
 * by scanning its shards once (remembered for that version of the dataset).
 */
export async function datasetTokens(dir: string): Promise<{ tokens: number; from: 'merge index' | 'shard scan' }> {
  const meta = await readDatasetMeta(dir);
  const key = `${dir}\0${meta.stateText}`;
  const known = scanned.get(key);
  if (known !== undefined) return { tokens: known, from: 'shard scan' };
  const index = await DatasetIndex.open(dir, meta.shards, { persist: false });
  try {
    const tokens = index.totals().tokens;
    if (index.shards.every((s) => !s.rebuilt)) return { tokens, from: 'merge index' };
    if (scanned.size >= 8) scanned.delete(scanned.keys().next().value ?? '');
    scanned.set(key, tokens);
    return { tokens, from: 'shard scan' };
  } finally {
    await index.close();
  }
}

/** The estimate for the step of `p` (a step's payload with `hiddenStates`). */
export async function estimateHiddenStates(p: TrainPayload): Promise<HiddenStatesEstimate> {
  const hs = p.hiddenStates;
  const index = p.stepIndex ?? 0;
  const where = `train.steps[${index}].hiddenStates`;
  if (hs === undefined) throw new AppError(`${where}: the step declares no hidden states`);
  const shape = await readModelShape(hs.model, where);
  if (shape.numHiddenLayers !== null && hs.layers > shape.numHiddenLayers + 1)
    throw new AppError(
      `${where}.layers: ${hs.layers} hidden-state vectors per token, but ${shape.configFile} gives num_hidden_layers ${shape.numHiddenLayers} (at most ${shape.numHiddenLayers + 1}: the embeddings' output and each layer's)`,
    );
  let counted: { tokens: number; from: 'merge index' | 'shard scan' };
  try {
    counted = await datasetTokens(p.dataset);
  } catch (e: unknown) {
    throw new AppError(`${where}: cannot count the tokens of the training dataset ${p.dataset}: ${errorMessage(e)}`);
  }
  const bytesPerElement = HIDDEN_STATE_DTYPES[hs.dtype];
  const inputs = {
    tokens: counted.tokens,
    hiddenSize: shape.hiddenSize,
    layers: hs.layers,
    bytesPerElement,
    overheadBytesPerToken: hs.overheadBytesPerToken,
  };
  return {
    step: p.steps?.[index]?.name ?? String(index),
    stepIndex: index,
    steps: p.steps?.length ?? 1,
    where,
    ...inputs,
    tokensFrom: counted.from,
    dataset: p.dataset,
    dtype: hs.dtype,
    margin: hs.margin,
    configFile: shape.configFile,
    bytes: hiddenStatesBytes(inputs),
  };
}

/** The mount point holding `dir` (from /proc/self/mountinfo), or null where that cannot be read. */
async function mountPointOf(dir: string): Promise<string | null> {
  let text: string;
  let real: string;
  try {
    [text, real] = await Promise.all([readFile('/proc/self/mountinfo', 'utf8'), realpath(dir)]);
  } catch {
    return null;
  }
  let best: string | null = null;
  for (const line of text.split('\n')) {
    const field = line.split(' ')[4];
    if (field === undefined) continue;
    const mount = field.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(parseInt(o, 8)));
    const inside = mount === '/' || real === mount || real.startsWith(`${mount}/`);
    if (inside && (best === null || mount.length >= best.length)) best = mount;
  }
  return best;
}

/** The file system of `dir` (or of its nearest existing ancestor). */
export async function diskOf(dir: string): Promise<DiskSeen> {
  let p = dir;
  while (!(await exists(p)) && path.dirname(p) !== p) p = path.dirname(p);
  const s = await statfs(p);
  return { path: (await mountPointOf(p)) ?? p, totalBytes: s.blocks * s.bsize, freeBytes: s.bavail * s.bsize };
}

/** Bytes of the files under `dir` (0 when it does not exist): what a rerun of the step overwrites. */
export async function folderBytes(dir: string): Promise<number> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT') || isErrno(e, 'ENOTDIR')) return 0;
    throw e;
  }
  let total = 0;
  for (const n of names) {
    const f = path.join(dir, n);
    const st = await lstat(f);
    total += st.isDirectory() ? await folderBytes(f) : st.size;
  }
  return total;
}

/** The verdict on an estimate: the line that says why, and the entry `status` shows. */
export interface HiddenStatesVerdict {
  verdict: TrainHiddenStates['verdict'];
  reason: string;
  entry: TrainHiddenStates;
}

/**
 * Sets an estimate against the file system of the step's output folder. Needed: the estimate
 * plus its margin plus the step's `minFreeDiskGiB`. A file system smaller than that in all is
 * `refused`; one with less free (counting what the output folder already holds, which a rerun
 * overwrites) is `waiting`; otherwise `fits`.
 */
export function judgeHiddenStates(
  e: HiddenStatesEstimate,
  disk: DiskSeen,
  ctx: { minFreeDiskGiB: number; reusableBytes: number; chain: string; jobId: string },
): HiddenStatesVerdict {
  const extra = ctx.minFreeDiskGiB * 2 ** 30;
  const needed = Math.ceil(e.bytes * (1 + e.margin) + extra);
  const plus = `${Math.round(e.margin * 100)}% margin${extra > 0 ? ` + minFreeDiskGiB ${ctx.minFreeDiskGiB}` : ''}`;
  const est = `hidden states ≈ ${formatBytes(e.bytes)} (${hiddenStatesFormula(e)})`;
  let verdict: TrainHiddenStates['verdict'];
  let reason: string;
  if (disk.totalBytes < needed) {
    verdict = 'refused';
    reason = `step ${e.step}: ${est}, ${formatBytes(needed)} with the ${plus}, cannot fit on ${disk.path}: its file system is ${formatBytes(disk.totalBytes)} in all (${e.where}; tokens of ${e.dataset}, hidden size from ${e.configFile})`;
  } else if (disk.freeBytes + ctx.reusableBytes < needed) {
    verdict = 'waiting';
    reason = `${est}, ${disk.path} has ${formatBytes(disk.freeBytes)} free${ctx.reusableBytes > 0 ? ` (+ ${formatBytes(ctx.reusableBytes)} in the step's output folder)` : ''}; step ${e.step} waits for ${formatBytes(needed)} (the estimate + ${plus})`;
  } else {
    verdict = 'fits';
    reason = `step ${e.step}: ${est}; ${disk.path} has ${formatBytes(disk.freeBytes)} free of ${formatBytes(disk.totalBytes)}`;
  }
  return {
    verdict,
    reason,
    entry: {
      chain: ctx.chain,
      jobId: ctx.jobId,
      step: e.step,
      stepIndex: e.stepIndex,
      steps: e.steps,
      bytes: e.bytes,
      tokens: e.tokens,
      tokensFrom: e.tokensFrom,
      dataset: e.dataset,
      hiddenSize: e.hiddenSize,
      layers: e.layers,
      dtype: e.dtype,
      bytesPerElement: e.bytesPerElement,
      overheadBytesPerToken: e.overheadBytesPerToken,
      margin: e.margin,
      neededBytes: needed,
      configFile: e.configFile,
      disk: { ...disk, reusableBytes: ctx.reusableBytes },
      verdict,
      at: new Date().toISOString(),
    },
  };
}

/**
 * The step's estimate and verdict before it starts: the file system of `outputDir` (the step's
 * output folder, or the nearest folder that exists), crediting what that folder already holds.
 */
export async function checkHiddenStates(
  p: TrainPayload,
  outputDir: string,
  jobId: string,
): Promise<HiddenStatesVerdict> {
  const estimate = await estimateHiddenStates(p);
  const [disk, reusableBytes] = await Promise.all([diskOf(outputDir), folderBytes(outputDir)]);
  return judgeHiddenStates(estimate, disk, {
    minFreeDiskGiB: p.minFreeDiskGiB,
    reusableBytes,
    chain: p.chain ?? jobId,
    jobId,
  });
}

/**
 * Lines for `tokenmill train` when it queues a chain: each step's estimate, set against the run
 * folder's file system as this machine sees it; the train worker sizes it again before the step
 * starts (the model may be only on the GPU machine: then the line says it is not sized here).
 */
export async function describeHiddenStatesAtQueue(payload: TrainPayload): Promise<string[]> {
  const lines: string[] = [];
  const ctx = { reusableBytes: 0, chain: '', jobId: '' };
  for (const [i, step] of (payload.steps ?? []).entries()) {
    if (step.hiddenStates === undefined) continue;
    const p = stepPayload(payload, i);
    try {
      const e = await estimateHiddenStates(p);
      const disk = await diskOf(payload.runDir);
      const { entry } = judgeHiddenStates(e, disk, { ...ctx, minFreeDiskGiB: p.minFreeDiskGiB });
      lines.push(`step ${step.name}: ${describeHiddenStates(entry)}`);
    } catch (err: unknown) {
      lines.push(
        `step ${step.name}: hidden states not sized here: ${errorMessage(err)} (the train worker sizes them before the step starts)`,
      );
    }
  }
  return lines;
}
