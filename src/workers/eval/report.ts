/**
 * The evaluation report (`eval.json`, `tokenmill eval --json`): per dataset and overall, the
 * drafter's acceptance and both phases' speed, the comparison with the previous attempt's
 * report, the warnings and the checks that failed. Pure: built from totals, no I/O.
 */
import { type PhaseStats, type PhaseTotals, phaseStats, speedupOf, sumTotals } from './stats.js';

/** `eval.json`'s format version. */
export const EVAL_REPORT_VERSION = 1;

/**
 * What an endpoint that is tokenmill's SGLang simulator announced (`tokenmill_simulator` in its
 * `/server_info`, docs/simulator.md): its acceptance is configured, its speeds come from its load
 * model; neither is a measurement of a drafter.
 */
export interface SimulatorInfo {
  /** The SGLang release it imitates (its `version` is that release's, not its own). */
  imitates: string | null;
  /** The mean accept length it was configured with (tokens per verify step); null without speculation. */
  meanAcceptLength: number | null;
  /** Per draft position, the configured acceptance rates; null without speculation. */
  acceptance: number[] | null;
  /** The configured mean accept length of each dataset that has its own. */
  perDataset: Record<string, number>;
  /** What a verify step costs beyond a plain decode step, as a share of one; null without speculation. */
  draftOverhead: number | null;
}

/** What a drafter endpoint says about itself (`/server_info`). */
export interface DrafterEndpointInfo {
  url: string;
  version: string | null;
  modelPath: string | null;
  algorithm: string;
  draftModelPath: string;
  numSteps: number | null;
  eagleTopk: number | null;
  numDraftTokens: number | null;
  /** DFLASH: the slots of a drafted block (`/server_info` `speculative_dflash_block_size`); absent in reports made before it was read. */
  blockSize?: number | null;
  /** The simulator's announcement; null for a server that made none (SGLang). */
  simulator: SimulatorInfo | null;
}

/** What a baseline endpoint says about itself. */
export interface BaselineEndpointInfo {
  url: string;
  version: string | null;
  modelPath: string | null;
  /** The simulator's announcement; null for a server that made none (SGLang). */
  simulator: SimulatorInfo | null;
}

/**
 * Where a report's figures come from: `sglang`, measured on servers that made no simulator
 * announcement; `simulator`, when a drafter or baseline endpoint is tokenmill's simulator.
 */
export type EvalSource = 'sglang' | 'simulator';

/** With the source `simulator`: what its figures are, in words and in the simulator's settings. */
export interface SimulatedFigures {
  /** The endpoints that announced themselves as the simulator (drafter and baseline). */
  endpoints: string[];
  /** The acceptance is the simulator's setting (a drafter endpoint is the simulator). */
  acceptanceConfigured: boolean;
  /** The configured mean accept length (the first simulated drafter endpoint's), null when none is simulated. */
  meanAcceptLength: number | null;
  /** The configured mean accept length of each dataset evaluated: its own where set, else the top level. */
  datasets: Record<string, number>;
  /** A verify step's configured cost beyond a decode step; null when no drafter endpoint is simulated. */
  draftOverhead: number | null;
  /** One sentence for people: what is configured, what follows from the load model. */
  note: string;
}

/** The settings a measurement was taken with: two reports compare only when these agree. */
export interface EvalSettings {
  concurrency: number;
  maxNewTokens: number;
  /** `dataset`, or the parameters sent. */
  sampling: 'dataset' | Record<string, unknown>;
  maxPromptsPerDataset: number;
  /** `held-out` (each dataset's eval-prompts.jsonl) or the file of `eval.prompts`. */
  prompts: string;
}

/** Changes since the previous report (this minus previous); null where either side lacks the figure. */
export interface EvalDelta {
  acceptLength: number | null;
  /** (this − previous) / previous acceptance length. */
  acceptLengthChange: number | null;
  acceptRate: number | null;
  drafterTokensPerSec: number | null;
  speedup: number | null;
}

/** One dataset's (or the overall) figures. */
export interface EvalSection {
  /** Prompts sent (per phase). */
  prompts: number;
  drafter: PhaseStats;
  baseline: PhaseStats | null;
  speedup: number | null;
  /** Against the previous report's same section; null without one. */
  delta: EvalDelta | null;
}

/** One dataset's section, with where its prompts came from. */
export interface DatasetEval extends EvalSection {
  dataset: string;
  promptFile: string;
}

/** A check below its threshold: the reason the exit code is not 0. */
export interface EvalFailure {
  check: 'minAcceptLength' | 'minSpeedup';
  value: number | null;
  threshold: number;
  message: string;
}

/** The whole report. */
export interface EvalReport {
  version: typeof EVAL_REPORT_VERSION;
  run: string;
  /** The attempt evaluated (its folder name), or null for `--checkpoint`. */
  attempt: string | null;
  /** The drafter the endpoints must serve (the checkpoint folder). */
  drafter: string;
  measuredAt: string;
  durationSec: number;
  endpoints: DrafterEndpointInfo[];
  baseline: BaselineEndpointInfo[] | null;
  /** Measured on SGLang, or produced by the simulator (see {@link EvalSource}). */
  source: EvalSource;
  /** With the source `simulator`: the configured figures; null for SGLang. */
  simulated: SimulatedFigures | null;
  settings: EvalSettings;
  datasets: DatasetEval[];
  overall: EvalSection;
  /** Datasets not measured, and why (no held-out prompts). */
  skipped: { dataset: string; reason: string }[];
  /** The report compared with. */
  previous: { attempt: string | null; file: string; measuredAt: string | null; comparable: boolean } | null;
  warnings: string[];
  failed: EvalFailure[];
  /** No check failed. */
  ok: boolean;
}

/** One dataset's measured totals, as the runner hands them over. */
export interface DatasetTotals {
  dataset: string;
  promptFile: string;
  prompts: number;
  drafter: PhaseTotals;
  baseline: PhaseTotals | null;
}

/** The thresholds of `eval`. */
export interface EvalThresholds {
  minAcceptLength?: number | undefined;
  minSpeedup?: number | undefined;
  maxAcceptDrop: number;
}

const sub = (a: number | null | undefined, b: number | null | undefined): number | null =>
  a === null || a === undefined || b === null || b === undefined ? null : a - b;

/** This section minus the previous one. */
export function deltaOf(cur: EvalSection, prev: EvalSection): EvalDelta {
  const a = cur.drafter.acceptLength;
  const p = prev.drafter.acceptLength;
  return {
    acceptLength: sub(a, p),
    acceptLengthChange: a === null || a === undefined || p === null || p === undefined || p === 0 ? null : (a - p) / p,
    acceptRate: sub(cur.drafter.acceptRate, prev.drafter.acceptRate),
    drafterTokensPerSec: sub(cur.drafter.tokensPerSec, prev.drafter.tokensPerSec),
    speedup: sub(cur.speedup, prev.speedup),
  };
}

function sectionOf(prompts: number, drafter: PhaseTotals, baseline: PhaseTotals | null): EvalSection {
  const d = phaseStats(drafter, true);
  const b = baseline === null ? null : phaseStats(baseline, false);
  return { prompts, drafter: d, baseline: b, speedup: speedupOf(d, b), delta: null };
}

/** Why two reports' figures do not compare, or undefined when they do. */
export function incomparable(a: EvalSettings, b: EvalSettings): string | undefined {
  const diffs: string[] = [];
  if (a.concurrency !== b.concurrency) diffs.push(`concurrency ${b.concurrency} → ${a.concurrency}`);
  if (a.maxNewTokens !== b.maxNewTokens) diffs.push(`maxNewTokens ${b.maxNewTokens} → ${a.maxNewTokens}`);
  if (JSON.stringify(a.sampling) !== JSON.stringify(b.sampling))
    diffs.push(`sampling ${JSON.stringify(b.sampling)} → ${JSON.stringify(a.sampling)}`);
  if (a.prompts !== b.prompts) diffs.push(`prompts ${b.prompts} → ${a.prompts}`);
  if (a.maxPromptsPerDataset !== b.maxPromptsPerDataset)
    diffs.push(`maxPromptsPerDataset ${b.maxPromptsPerDataset} → ${a.maxPromptsPerDataset}`);
  return diffs.length === 0 ? undefined : diffs.join(', ');
}

const fmt = (x: number | null | undefined, digits = 2): string =>
  x === null || x === undefined ? '?' : x.toFixed(digits);

/** The report's warnings and failed checks for its figures (and deltas). */
function judge(
  report: Pick<EvalReport, 'datasets' | 'overall' | 'previous'>,
  t: EvalThresholds,
  /** This report's source, when the previous report's differs. */
  sourceChanged?: EvalSource,
): { warnings: string[]; failed: EvalFailure[] } {
  const warnings: string[] = [];
  const failed: EvalFailure[] = [];
  const o = report.overall;
  const sections: [string, EvalSection][] = [
    ...report.datasets.map((d): [string, EvalSection] => [`dataset ${d.dataset}`, d]),
    // With one dataset, the overall figures are its own: warned about once.
    ...(report.datasets.length === 1 ? [] : [['overall', o] as [string, EvalSection]]),
  ];
  for (const [name, s] of sections) {
    if (s.speedup !== null && s.speedup < 1)
      warnings.push(
        `${name}: the drafter makes decoding slower: ${fmt(s.drafter.tokensPerSec, 1)} vs ${fmt(s.baseline?.tokensPerSec, 1)} tok/s (speed-up ${fmt(s.speedup)}x)`,
      );
    const change = s.delta?.acceptLengthChange;
    if (change !== null && change !== undefined && -change > t.maxAcceptDrop)
      warnings.push(
        `${name}: acceptance length fell by ${(-change * 100).toFixed(1)} % since attempt ${report.previous?.attempt ?? '?'}: ` +
          `${fmt((s.drafter.acceptLength ?? 0) - (s.delta?.acceptLength ?? 0))} → ${fmt(s.drafter.acceptLength)} (eval.maxAcceptDrop ${t.maxAcceptDrop})`,
      );
    const phases: [string, PhaseStats | null][] = [
      ['drafter', s.drafter],
      ['baseline', s.baseline],
    ];
    for (const [phase, p] of phases)
      if (p !== null && p.failures > 0 && name !== 'overall')
        warnings.push(`${name}: ${p.failures} of ${p.requests} ${phase} requests failed; the figures leave them out`);
  }
  if (report.previous !== null && sourceChanged !== undefined)
    warnings.push(
      `the previous report (${report.previous.file}) was ${sourceChanged === 'simulator' ? 'measured on SGLang' : 'simulated'}, this one ${sourceChanged === 'simulator' ? 'is simulated' : 'on SGLang'}: its deltas are not comparable`,
    );
  else if (report.previous !== null && !report.previous.comparable)
    warnings.push(
      `the previous report (${report.previous.file}) was measured with other settings: its deltas are not comparable`,
    );
  if (t.minAcceptLength !== undefined) {
    const v = o.drafter.acceptLength ?? null;
    if (v === null || v < t.minAcceptLength)
      failed.push({
        check: 'minAcceptLength',
        value: v,
        threshold: t.minAcceptLength,
        message: `acceptance length ${fmt(v)} is below eval.minAcceptLength ${t.minAcceptLength}`,
      });
  }
  if (t.minSpeedup !== undefined) {
    const v = o.speedup;
    if (v === null || v < t.minSpeedup)
      failed.push({
        check: 'minSpeedup',
        value: v,
        threshold: t.minSpeedup,
        message: `speed-up ${fmt(v)}x (${fmt(o.drafter.tokensPerSec, 1)} vs ${fmt(o.baseline?.tokensPerSec, 1)} tok/s) is below eval.minSpeedup ${t.minSpeedup}`,
      });
  }
  return { warnings, failed };
}

const acceptText = (x: number): string => x.toFixed(2);

/**
 * What the endpoints' announcements make of the figures: null when none is the simulator; else the
 * simulated endpoints, the configured acceptance per dataset evaluated, and a sentence saying so.
 */
export function simulatedFigures(
  endpoints: readonly DrafterEndpointInfo[],
  baseline: readonly BaselineEndpointInfo[] | null,
  datasets: readonly string[],
): SimulatedFigures | null {
  const simulated = [...endpoints, ...(baseline ?? [])].filter((e) => e.simulator !== null).map((e) => e.url);
  if (simulated.length === 0) return null;
  const drafter = endpoints.find((e) => e.simulator !== null)?.simulator ?? null;
  const top = drafter?.meanAcceptLength ?? null;
  const perDataset: Record<string, number> = {};
  for (const d of datasets) {
    const v = drafter?.perDataset[d] ?? top;
    if (v !== null) perDataset[d] = v;
  }
  const baselineSimulated = (baseline ?? []).some((b) => b.simulator !== null);
  const parts: string[] = [];
  if (drafter !== null) {
    const own = Object.keys(drafter.perDataset).filter((d) => datasets.includes(d));
    parts.push(
      `the acceptance is the simulator's configured one (accept len ${top === null ? '?' : acceptText(top)}` +
        `${own.length === 0 ? '' : `; ${own.map((d) => `${d} ${acceptText(perDataset[d] ?? 0)}`).join(', ')}`}), not measured from the drafter`,
    );
    parts.push(
      baselineSimulated || baseline === null
        ? `its tok/s${baseline === null ? '' : ' and the speed-up'} come from the simulator's load model${drafter.draftOverhead === null ? '' : ` (a verify step costs ${acceptText(1 + drafter.draftOverhead)} decode steps)`}`
        : "its tok/s come from the simulator's load model: the speed-up compares a simulator with a real server",
    );
  } else {
    parts.push("the baseline is the simulator: its tok/s, and so the speed-up, come from the simulator's load model");
  }
  return {
    endpoints: simulated,
    acceptanceConfigured: drafter !== null,
    meanAcceptLength: top,
    datasets: perDataset,
    draftOverhead: drafter?.draftOverhead ?? null,
    note: `SIMULATED: ${parts.join('; ')}`,
  };
}

/** What {@link buildReport} needs besides the totals: the report's own header fields, and more. */
export type ReportContext = Pick<
  EvalReport,
  'run' | 'attempt' | 'drafter' | 'measuredAt' | 'durationSec' | 'endpoints' | 'baseline' | 'settings'
> & {
  skipped: { dataset: string; reason: string }[];
  /** The previous report and where it was read, when there is one. */
  previous?: { report: EvalReport; file: string } | undefined;
  thresholds: EvalThresholds;
};

/** The report of measured totals: figures, deltas against the previous report, warnings, checks. */
export function buildReport(totals: readonly DatasetTotals[], ctx: ReportContext): EvalReport {
  const hasBaseline = ctx.baseline !== null;
  const simulated = simulatedFigures(
    ctx.endpoints,
    ctx.baseline,
    totals.map((d) => d.dataset),
  );
  const source: EvalSource = simulated === null ? 'sglang' : 'simulator';
  const datasets: DatasetEval[] = totals.map((d) => ({
    dataset: d.dataset,
    promptFile: d.promptFile,
    ...sectionOf(d.prompts, d.drafter, d.baseline),
  }));
  const overall = sectionOf(
    totals.reduce((n, d) => n + d.prompts, 0),
    sumTotals(totals.map((d) => d.drafter)),
    hasBaseline ? sumTotals(totals.map((d) => d.baseline).filter((b) => b !== null)) : null,
  );
  let previous: EvalReport['previous'] = null;
  let sourceChanged = false;
  if (ctx.previous !== undefined) {
    const prev = ctx.previous.report;
    // A simulated report and a measured one do not compare (one from before sources were recorded
    // has none and is taken as it is).
    const prevSource: EvalSource | undefined = prev.source;
    sourceChanged = prevSource !== undefined && prevSource !== source;
    previous = {
      attempt: prev.attempt,
      file: ctx.previous.file,
      measuredAt: prev.measuredAt,
      comparable: incomparable(ctx.settings, prev.settings) === undefined && !sourceChanged,
    };
    for (const d of datasets) {
      const p = prev.datasets.find((x) => x.dataset === d.dataset);
      if (p !== undefined) d.delta = deltaOf(d, p);
    }
    overall.delta = deltaOf(overall, prev.overall);
  }
  const partial = { datasets, overall, previous };
  const { warnings, failed } = judge(partial, ctx.thresholds, sourceChanged ? source : undefined);
  return {
    version: EVAL_REPORT_VERSION,
    run: ctx.run,
    attempt: ctx.attempt,
    drafter: ctx.drafter,
    measuredAt: ctx.measuredAt,
    durationSec: ctx.durationSec,
    endpoints: ctx.endpoints,
    baseline: ctx.baseline,
    source,
    simulated,
    settings: ctx.settings,
    datasets,
    overall,
    skipped: ctx.skipped,
    previous,
    warnings,
    failed,
    ok: failed.length === 0,
  };
}

/** A previous `eval.json` as read back: a report of this version, or a reason it is not one. */
export function parseReport(text: string, file: string): EvalReport | string {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e: unknown) {
    return `${file}: not JSON (${e instanceof Error ? e.message : String(e)})`;
  }
  const r = value as Partial<EvalReport> | null;
  if (r === null || typeof r !== 'object' || r.version !== EVAL_REPORT_VERSION)
    return `${file}: not an eval report of version ${EVAL_REPORT_VERSION}`;
  if (!Array.isArray(r.datasets) || typeof r.overall !== 'object' || r.overall === null || r.settings === undefined)
    return `${file}: an eval report without datasets, overall or settings`;
  return r as EvalReport;
}
