/**
 * The simulator says what it is: `/server_info` (and `/get_server_info`) carries one field real
 * SGLang never sends, {@link SIM_ANNOUNCEMENT_KEY}, with the speculative settings it was configured
 * with. A client (tokenmill's evaluation) can then tell figures the simulator was told to produce
 * from figures measured on a real server. `announce: false` (`tokenmill sim --no-announce`) leaves
 * it out, for a simulator that should pass for SGLang.
 */
import { expectedAcceptLength, type ResolvedSpeculative } from './speculative.js';
import type { SimVersion } from './types.js';

/** The `/server_info` key of the announcement; real SGLang sends no key that starts with `tokenmill`. */
export const SIM_ANNOUNCEMENT_KEY = 'tokenmill_simulator';

/** One acceptance the simulator was configured with: per draft position, and its mean accept length. */
export interface AnnouncedAcceptance {
  /** Per draft position k: the chance draft k is accepted given drafts < k were. */
  acceptance: number[];
  /** Expected tokens per verify step, the bonus token included (1 + p1 + p1·p2 + …). */
  mean_accept_length: number;
}

/** The announcement, keys as SGLang writes its own (snake_case). */
export interface SimAnnouncement {
  /** Always `tokenmill sim`. */
  simulator: 'tokenmill sim';
  /** The SGLang release whose responses it imitates (its `version`). */
  imitates: SimVersion;
  /** What the figures are: set by its options, not measured from a model. */
  note: string;
  /** The speculative decoding it was configured with; null without it. */
  speculative:
    | (AnnouncedAcceptance & {
        algorithm: string;
        /** Drafts per verify step (DFLASH: the block's slots less one). */
        num_steps: number;
        /** DFLASH: slots per drafted block; null for EAGLE3. */
        block_size: number | null;
        /** Per dataset (the rid's `eval:<dataset>:` or `<dataset>/`), where it differs from the top level. */
        per_dataset: Record<string, AnnouncedAcceptance>;
        /** What a verify step costs beyond a plain decode step, as a share of one (DFLASH: the block's verify included). */
        draft_overhead: number;
      })
    | null;
}

const rounded = (x: number): number => Math.round(x * 1e6) / 1e6;

function acceptanceOf(rates: readonly number[]): AnnouncedAcceptance {
  return { acceptance: rates.map(rounded), mean_accept_length: rounded(expectedAcceptLength(rates)) };
}

/** The announcement of a simulator imitating `version`, with `spec` (or none). */
export function simAnnouncement(version: SimVersion, spec: ResolvedSpeculative | undefined): SimAnnouncement {
  return {
    simulator: 'tokenmill sim',
    imitates: version,
    note:
      spec === undefined
        ? 'a simulator of SGLang: its speeds come from its load model, not from a model'
        : 'a simulator of SGLang: its acceptance is the configured one below, not measured from the drafter; its speeds come from its load model',
    speculative:
      spec === undefined
        ? null
        : {
            algorithm: spec.algorithm,
            num_steps: spec.numSteps,
            block_size: spec.blockSize ?? null,
            ...acceptanceOf(spec.acceptance),
            per_dataset: Object.fromEntries([...spec.perDataset].map(([name, rates]) => [name, acceptanceOf(rates)])),
            draft_overhead: spec.draftOverhead,
          },
  };
}
