/** The `train` section of the config: the train stage's command or chain of steps. */
import { z } from 'zod';

import { errorMessage } from '../errors.js';
import { name, nonNegativeInt, positiveInt } from './schema-util.js';

/** A `train.progressRegex`: a valid regular expression with at least one of its named groups. */
const progressRegex = () =>
  z
    .string({ error: 'expected a regular expression (a string)' })
    .min(1, { error: 'expected a regular expression, not an empty string' })
    .superRefine((s, ctx) => {
      let re: RegExp;
      try {
        re = new RegExp(s);
      } catch (e: unknown) {
        ctx.addIssue({ code: 'custom', message: `expected a valid regular expression: ${errorMessage(e)}` });
        return;
      }
      const groups = ['step', 'total', 'loss'].filter((g) => re.source.includes(`(?<${g}>`));
      if (groups.length === 0)
        ctx.addIssue({
          code: 'custom',
          message: 'expected named groups: at least one of (?<step>…), (?<total>…), (?<loss>…)',
        });
    });

const trainCommand = () =>
  z
    .array(z.string({ error: 'expected a string' }), {
      error: 'expected a list of strings (a command and its arguments)',
    })
    .min(1, { error: 'expected a command and its arguments' });

/** Element types of stored hidden states, and their bytes. */
export const HIDDEN_STATE_DTYPES = { bfloat16: 2, float16: 2, float32: 4 } as const;

/** What a hidden-state extraction step writes (`train.steps[].hiddenStates`), sized before it starts. */
export const HiddenStatesSchema = z.strictObject({
  model: z
    .string({ error: 'expected the target model folder (or its config.json)' })
    .min(1, { error: 'expected the target model folder (or its config.json), not an empty string' })
    .describe(
      "The target model's folder, or its `config.json` (relative to the config file): its `hidden_size` (`text_config.hidden_size` for a multimodal model) is the width of one stored vector; `num_hidden_layers` bounds `layers`. Read by the train worker before the step starts.",
    ),
  layers: positiveInt()
    .default(4)
    .describe(
      'Hidden-state vectors stored per token. EAGLE-3 stores 4: three auxiliary layers and the last one (SpecForge: `aux_hidden_state` [seq, 3·H] + `hidden_state` [seq, H]; speculators: `hidden_states` [seq, 3 + 1, H]).',
    ),
  dtype: z
    .enum(['bfloat16', 'float16', 'float32'], { error: 'expected one of "bfloat16", "float16", "float32"' })
    .default('bfloat16')
    .describe('Element type of the stored hidden states: bfloat16 and float16 take 2 bytes, float32 4.'),
  overheadBytesPerToken: nonNegativeInt()
    .default(16)
    .describe('Bytes stored per token besides the hidden states: the token id and the loss mask (int64 + int64 = 16).'),
  margin: z
    .number({ error: 'expected a fraction >= 0 (0.05 = 5 %)' })
    .min(0, { error: 'expected a fraction >= 0 (0.05 = 5 %)' })
    .default(0.05)
    .describe(
      'Added to the estimate before it is compared with the file system (0.05 = 5 %): file headers, and samples a little longer than counted.',
    ),
});

/** A step's `hiddenStates`. */
export type HiddenStatesConfig = z.infer<typeof HiddenStatesSchema>;

const groupsExpected = (what: string): string =>
  `expected ${what}, or { target: N, drafter: M } (a target group and a drafter group)`;

/**
 * A step's GPUs: a number, or a target group and a drafter group (e.g. `{ target: 5, drafter: 3 }`:
 * the target model's capture servers on five GPUs, the drafter's trainer ranks on three).
 */
export const StepGpusSchema = z.union(
  [
    nonNegativeInt(),
    z.strictObject(
      {
        target: positiveInt('a number of GPUs >= 1 for the target group'),
        drafter: positiveInt('a number of GPUs >= 1 for the drafter group'),
      },
      { error: groupsExpected('a number of GPUs >= 0') },
    ),
  ],
  { error: groupsExpected('a number of GPUs >= 0') },
);
export type StepGpus = z.infer<typeof StepGpusSchema>;

/** A step's free memory per GPU: one number, or one per group of a split step. */
export const StepGpuMemSchema = z.union(
  [
    nonNegativeInt(),
    z.strictObject(
      {
        target: nonNegativeInt('free MiB >= 0 for each GPU of the target group'),
        drafter: nonNegativeInt('free MiB >= 0 for each GPU of the drafter group'),
      },
      { error: groupsExpected('free MiB >= 0 per GPU') },
    ),
  ],
  { error: groupsExpected('free MiB >= 0 per GPU') },
);

/** Placeholders that name a split step's groups. */
export const GROUP_PLACEHOLDER = /\{(target_gpus|drafter_gpus)\}/;

/** One step of a chain of GPU steps (`train.steps`). */
export const TrainStepSchema = z.strictObject({
  name: name().describe('Step name, unique in the chain: names its folder `<attempt>/<name>/` and its job.'),
  command: trainCommand().describe(
    "The step's command and its arguments (placeholders as in `train.command`, `{output}` being the step's `output/` folder, plus `{output:<step>}`: the output folder of an earlier step of the same chain).",
  ),
  gpus: StepGpusSchema.optional().describe(
    "GPUs the step needs: a number, or `{ target: N, drafter: M }`, a target group and a drafter group (e.g. the target model's capture servers on 5 GPUs, the drafter's trainer on 3), each preflighted on its own and given to the command as `{target_gpus}` / `{drafter_gpus}` (comma-separated indices) and `TOKENMILL_TARGET_GPUS` / `TOKENMILL_DRAFTER_GPUS`; `CUDA_VISIBLE_DEVICES` names both groups, the target's first, and `{gpus}` is their total. Omitted = `train.gpus`.",
  ),
  minFreeGpuMemMiB: StepGpuMemSchema.optional().describe(
    'Free memory each of its GPUs needs (MiB); for a split step, one number for both groups or `{ target, drafter }`. Omitted = `train.minFreeGpuMemMiB`.',
  ),
  minFreeDiskGiB: z
    .number({ error: 'expected a number >= 0 (GiB)' })
    .min(0, { error: 'expected a number >= 0 (GiB)' })
    .default(0)
    .describe(
      "Free disk space (GiB) the run folder's file system needs before the step starts (hidden states can take terabytes); until then it waits.",
    ),
  hiddenStates: HiddenStatesSchema.optional().describe(
    "The hidden states the step writes (an extraction step: SpecForge's offline capture, speculators' `generate-offline-data`). Before the step starts, the worker estimates their size from the training dataset's tokens and the model's `hidden_size`; a file system smaller than that fails the step at once, one with too little free space makes it wait (on top of `minFreeDiskGiB`). See docs/train.md.",
  ),
});

/** A step of `train.steps`. */
export type TrainStep = z.infer<typeof TrainStepSchema>;

/** Settings of the train stage. */
export const TrainConfigSchema = z
  .strictObject({
    command: trainCommand()
      .optional()
      .describe(
        "Training command and its arguments, run without a shell, in its own process group, from the config file's folder. Placeholders in an argument: `{dataset}` (the training dataset folder), `{output}` (the attempt's `checkpoints/` folder), `{checkpoint}` (the checkpoint resumed from; empty when starting from scratch), `{gpus}` (the number of GPUs assigned; `CUDA_VISIBLE_DEVICES` names them). Exactly one of `command` / `steps`.",
      ),
    steps: z
      .array(TrainStepSchema, { error: 'expected a list of steps' })
      .min(1, { error: 'expected at least one step' })
      .optional()
      .describe(
        'A chain of GPU steps instead of one command (e.g. hidden-state extraction, then training): each step is its own train job with its own preflight, fingerprint and log, in `<output.dir>/<run>/train/<attempt>/<step>/`; a failed step stops the chain, and `--resume` reruns the chain from that step without redoing finished ones. Exactly one of `command` / `steps`.',
      ),
    gpus: nonNegativeInt().default(1).describe('GPUs the training command needs; 0 runs it on CPU.'),
    minFreeGpuMemMiB: nonNegativeInt()
      .default(20000)
      .describe(
        'Training starts only when each of those GPUs has at least this much free memory (MiB); until then the job waits, and `status` says why.',
      ),
    mode: z
      .enum(['from-scratch', 'resume'])
      .describe(
        '`from-scratch` starts a new training run; `resume` continues from the newest checkpoint of the latest attempt. No default: the choice is explicit (`tokenmill train --from-scratch|--resume` overrides it). Either way each attempt gets its own folder `<output.dir>/<run>/train/<attempt>/`; no checkpoint is ever deleted.',
      ),
    resumeArgs: z
      .array(z.string({ error: 'expected a string' }), { error: 'expected a list of strings (arguments)' })
      .default(['--resume', '{checkpoint}'])
      .describe(
        'Arguments appended to `command` when resuming (placeholders as in `command`). Resuming is refused unless `{checkpoint}` appears in `command` or here.',
      ),
    python: z
      .string({ error: 'expected a path to a Python interpreter' })
      .min(1, { error: 'expected a path to a Python interpreter' })
      .optional()
      .describe(
        "Python interpreter whose environment is fingerprinted (Python, torch, CUDA, package versions): a path (relative to the config file) or a name on the PATH. Omitted = the command's first word when it is a Python interpreter, else `python3` on the PATH.",
      ),
    allowEnvChange: z
      .boolean({ error: 'expected true or false' })
      .default(false)
      .describe(
        "Start even when the environment fingerprint differs from the last successful train run's (the difference is still shown and logged). `--allow-env-change` does the same for one run.",
      ),
    autoResume: z
      .boolean({ error: 'expected true or false' })
      .default(false)
      .describe(
        'When a train worker dies, resume its job from the newest checkpoint on another worker; otherwise the job fails, saying so.',
      ),
    progressRegex: progressRegex()
      .optional()
      .describe(
        'Regular expression (JavaScript syntax) with named groups `step`, `total` and/or `loss`, matched against each output line. Omitted = `step N/M` and `loss X` anywhere in a line.',
      ),
    cancelGraceMs: positiveInt()
      .default(30_000)
      .describe(
        "`tokenmill train --cancel` sends SIGTERM to the command's process group, then SIGKILL after this long (ms).",
      ),
    preflightPollMs: positiveInt()
      .default(30_000)
      .describe('How often a job waiting for GPU memory checks again (ms).'),
  })
  .superRefine(
    (t, ctx) => {
      if (typeof t !== 'object' || t === null || Array.isArray(t)) return;
      const has = (v: unknown): boolean => v !== undefined && v !== null;
      if (has(t.command) === has(t.steps)) {
        ctx.addIssue({
          code: 'custom',
          message: `expected exactly one of "command" or "steps", got ${has(t.command) ? 'both' : 'neither'}`,
        });
      }
      if (Array.isArray(t.steps)) {
        const seen = new Set<string>();
        t.steps.forEach((step: unknown, i: number) => {
          const n = typeof step === 'object' && step !== null ? (step as { name?: unknown }).name : undefined;
          if (typeof n !== 'string') return;
          if (seen.has(n))
            ctx.addIssue({
              code: 'custom',
              path: ['steps', i, 'name'],
              message: `expected a unique step name, got "${n}" again`,
            });
          seen.add(n);
          const st = step as Partial<TrainStep>;
          const split = typeof st.gpus === 'object';
          if (!split && typeof st.minFreeGpuMemMiB === 'object')
            ctx.addIssue({
              code: 'custom',
              path: ['steps', i, 'minFreeGpuMemMiB'],
              message: `expected one number: { target, drafter } needs gpus split the same way (gpus: { target: N, drafter: M }), got gpus: ${st.gpus ?? `train.gpus (${t.gpus})`}`,
            });
          const uses = (st.command ?? []).find((a) => GROUP_PLACEHOLDER.test(a));
          if (!split && uses !== undefined)
            ctx.addIssue({
              code: 'custom',
              path: ['steps', i, 'gpus'],
              message: `expected gpus: { target: N, drafter: M }: the command uses "${GROUP_PLACEHOLDER.exec(uses)?.[0] ?? ''}", which only a step with a target group and a drafter group has`,
            });
        });
      }
    },
    { when: () => true },
  );

/** The train section of the config. */
export type TrainConfig = z.infer<typeof TrainConfigSchema>;
