/**
 * The demo's config file, `<run dir>/tokenmill.yaml` (`out/demo/tokenmill.yaml` by default): the
 * config `tokenmill demo` runs with, written before generation starts, so that every other
 * command (`status`, `export`, `postprocess`, `train`, a later `run`) works on the demo's run with
 * `-c` and no hand editing. Its paths are absolute and it names no `redis.url`, so it opens the
 * demo's embedded Redis (its state lives in `<run dir>/redis`, found from `output.dir` and `run`).
 */
import path from 'node:path';
import { Document, isMap, isScalar } from 'yaml';
import { writeFileAtomic, type ConfigInput } from '../../shared/index.js';

/** Name of the demo's config file in its run folder. */
export const DEMO_CONFIG_FILE = 'tokenmill.yaml';

/** `<runDir>/tokenmill.yaml`. */
export function demoConfigPath(runDir: string): string {
  return path.join(runDir, DEMO_CONFIG_FILE);
}

/** The commands that inspect, post-process, export and train the demo's run, ready to paste. */
export interface DemoNextCommands {
  status: string;
  postprocess: string;
  export: { jsonl: string; specforge: string; speculators: string };
  /** Null when the demo has no train stage (no trainer environment). */
  train: string | null;
  /** Evaluates the latest attempt again (its eval.server starts the simulators); null without a train stage. */
  eval: string | null;
}

/** One shell word: left as it is when it holds nothing a shell reads specially, else single-quoted. */
export function shellWord(arg: string): string {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`;
}

/**
 * The demo's next commands on config `file` of run folder `runDir`. With `cwd`, a path inside it
 * is written relative to it (`out/demo/tokenmill.yaml`); without, every path is absolute.
 */
export function demoNextCommands(
  file: string,
  runDir: string,
  options: { trains: boolean; cwd?: string },
): DemoNextCommands {
  const shown = (p: string): string => {
    if (options.cwd === undefined) return shellWord(p);
    const rel = path.relative(options.cwd, p);
    return shellWord(rel !== '' && !rel.startsWith('..') && !path.isAbsolute(rel) ? rel : p);
  };
  const c = `-c ${shown(file)}`;
  const exportTo = (format: string, out: string): string =>
    `tokenmill export ${c} --format ${format} --out ${shown(path.join(runDir, 'export', out))}`;
  return {
    status: `tokenmill status ${c}`,
    postprocess: `tokenmill postprocess ${c}`,
    export: {
      jsonl: exportTo('jsonl', 'rows.jsonl'),
      specforge: exportTo('specforge', 'specforge.jsonl'),
      speculators: exportTo('speculators', 'speculators'),
    },
    train: options.trains ? `tokenmill train ${c} --resume` : null,
    eval: options.trains ? `tokenmill eval ${c}` : null,
  };
}

/** The next commands as the lines the demo prints at its end. */
export function formatDemoNext(file: string, next: DemoNextCommands): string {
  const lines = [
    `config: ${file} (the demo's run; every command below works on it)`,
    `  ${next.status}`,
    `  ${next.export.jsonl}`,
    `  ${next.export.specforge}`,
    `  ${next.export.speculators}`,
  ];
  if (next.train !== null) lines.push(`  ${next.train}`);
  if (next.eval !== null) lines.push(`  ${next.eval}`);
  return lines.join('\n');
}

/** The `--steps` of `train.resumeArgs` ('?' when it has none). */
function resumeSteps(config: ConfigInput): string {
  const args = config.train?.resumeArgs ?? [];
  const i = args.indexOf('--steps');
  return i < 0 ? '?' : (args[i + 1] ?? '?');
}

/** The first endpoint's port, for the `tokenmill sim --port` hint ('' when it has none). */
function portOf(endpoint: string | undefined): string {
  try {
    return endpoint === undefined ? '' : new URL(endpoint).port;
  } catch {
    return '';
  }
}

/**
 * The YAML text of the demo's config `config` (paths already absolute) as file `file`: a header
 * saying what it is and the commands that use it, and a comment above `sglang` saying that its
 * endpoint was the demo's simulator, gone with the demo, and how to start one in its place.
 */
export function demoConfigYaml(config: ConfigInput, file: string, runDir: string): string {
  const next = demoNextCommands(file, runDir, { trains: config.train !== undefined });
  const endpoint = config.sglang?.endpoints?.[0];
  const port = portOf(endpoint);
  const doc = new Document(config);
  doc.commentBefore = [
    ' The config `tokenmill demo` ran with; the demo writes it here before it starts generating',
    ' (and again on each run). Every path in it is absolute; with no `redis.url` it opens the',
    " demo's embedded Redis, whose state lives in the `redis/` folder beside this file.",
    '',
    ' Commands on the demo run:',
    `   ${next.status}`,
    `   ${next.postprocess}`,
    `   ${next.export.jsonl}`,
    `   ${next.export.specforge}`,
    `   ${next.export.speculators}`,
    ...(next.train === null
      ? []
      : [
          `   ${next.train}      # continues the newest checkpoint (train.resumeArgs: up to step ${resumeSteps(config)})`,
          `   tokenmill train -c ${shellWord(file)} --from-scratch`,
        ]),
    ...(next.eval === null ? [] : [`   ${next.eval}      # the latest attempt again`]),
  ]
    .map((l) => l.trimEnd())
    .join('\n');
  if (isMap(doc.contents)) {
    const evalKey = doc.contents.items.find((p) => isScalar(p.key) && p.key.value === 'eval');
    if (evalKey !== undefined && isScalar(evalKey.key))
      evalKey.key.commentBefore = [
        ' After each training, the eval step (and `tokenmill eval` on this file) starts two simulators',
        " with eval.server: one decoding speculatively with the attempt's drafter ({checkpoint}), one",
        " the target alone; it measures each dataset's held-out prompts on both and stops them.",
      ].join('\n');
    const sglang = doc.contents.items.find((p) => isScalar(p.key) && p.key.value === 'sglang');
    if (sglang !== undefined && isScalar(sglang.key)) {
      sglang.key.commentBefore = [
        ` ${endpoint ?? 'The endpoint'} was the demo's built-in SGLang simulator; it stopped with the demo.`,
        ' status, export, postprocess and train do not call it. To generate more with this file',
        ` (tokenmill run -c ${shellWord(file)}), start a simulator on that port first:`,
        `   tokenmill sim --port ${port === '' ? '<port>' : port} --time-scale 25 --seed 7`,
      ].join('\n');
    }
  }
  return doc.toString({ lineWidth: 0 });
}

/** Writes the demo's config to `file` atomically (a temporary file renamed over it). */
export async function writeDemoConfig(file: string, config: ConfigInput, runDir: string): Promise<void> {
  await writeFileAtomic(file, demoConfigYaml(config, file, runDir));
}
