/**
 * `export --drafter dflash`: the rows a DFlash trainer can use. DFlash draws its anchors among
 * supervised positions followed by a supervised one (anchor-positions.ts); a row with fewer than
 * 2 adjacent supervised tokens has none, and SpecForge's and speculators' DFlash trainers fail
 * on such a sample, so the export leaves it out and counts it. With
 * `postprocess.dflash.maskToken` set, no exported row may hold the mask token.
 */
import {
  ConfigError,
  DFLASH_MASK_TOKEN_KEY,
  PayloadError,
  addAnchorRow,
  anchorPositions,
  emptyAnchorHistogram,
  formatAnchorHistogram,
  formatInt,
  type AnchorHistogram,
  type DflashMaskToken,
} from '../../shared/index.js';

/** The drafters `export --drafter` knows. */
export const DRAFTERS = ['eagle3', 'dflash'] as const;
export type Drafter = (typeof DRAFTERS)[number];

/** Checks `--drafter`; throws a PayloadError naming the accepted ones. */
export function parseDrafter(value: string | undefined): Drafter {
  if (value === undefined) return 'eagle3';
  if ((DRAFTERS as readonly string[]).includes(value)) return value as Drafter;
  throw new PayloadError(`unknown --drafter ${JSON.stringify(value)}: expected one of ${DRAFTERS.join(', ')}`);
}

/** What a DFlash export left out and found, as the export's result carries it. */
export interface DflashExportStats {
  /** Rows left out: fewer than 2 adjacent supervised tokens (no anchor position). */
  leftOut: number;
  /** The rows considered (before leaving any out) by their anchor positions. */
  anchorPositions: AnchorHistogram;
  /** `postprocess.dflash.maskToken`, checked absent from every exported row; null when not configured. */
  maskToken: DflashMaskToken | null;
}

/** Rows whose ids are named in the mask-token error. */
const SHOWN_ROWS = 5;

/** The DFlash filter of one export: {@link admit} each row, then {@link finish}. */
export class DflashRows {
  readonly #maskToken: DflashMaskToken | undefined;
  readonly #histogram = emptyAnchorHistogram();
  #leftOut = 0;
  #maskRows = 0;
  readonly #maskRowNames: string[] = [];

  constructor(maskToken?: DflashMaskToken) {
    this.#maskToken = maskToken;
  }

  /**
   * Whether the row goes in: false for a row without an anchor position (counted). A row that
   * goes in and holds the mask token is noted for {@link finish}. `name` names the row in errors.
   */
  admit(ids: ArrayLike<number>, mask: ArrayLike<number>, name: () => string): boolean {
    const positions = anchorPositions(mask);
    addAnchorRow(this.#histogram, positions);
    if (positions === 0) {
      this.#leftOut += 1;
      return false;
    }
    const m = this.#maskToken;
    if (m !== undefined && Array.prototype.includes.call(ids, m.id)) {
      this.#maskRows += 1;
      if (this.#maskRowNames.length < SHOWN_ROWS) this.#maskRowNames.push(name());
    }
    return true;
  }

  /** Rows left out so far. */
  get leftOut(): number {
    return this.#leftOut;
  }

  /** The stats; throws a ConfigError at `postprocess.dflash.maskToken` when an exported row holds it. */
  finish(target: string): DflashExportStats {
    const m = this.#maskToken;
    if (m !== undefined && this.#maskRows > 0) {
      const more = this.#maskRows > this.#maskRowNames.length ? ', …' : '';
      throw new ConfigError([
        {
          path: DFLASH_MASK_TOKEN_KEY,
          message:
            `${JSON.stringify(m.token)} (id ${m.id}) is in the data: ${formatInt(this.#maskRows)} ` +
            `${this.#maskRows === 1 ? 'row' : 'rows'} of ${target} hold it (${this.#maskRowNames.join(', ')}${more}); ` +
            'DFlash could not tell its mask slots from those tokens: choose a special token the data never holds',
        },
      ]);
    }
    return { leftOut: this.#leftOut, anchorPositions: { ...this.#histogram }, maskToken: m ?? null };
  }
}

/** The DFlash lines of an export's summary for people. */
export function formatDflashExport(d: DflashExportStats): string[] {
  return [
    `DFlash: left out ${formatInt(d.leftOut)} ${d.leftOut === 1 ? 'row' : 'rows'} with fewer than 2 adjacent supervised tokens (no anchor position)`,
    `DFlash anchor positions per row: ${formatAnchorHistogram(d.anchorPositions, formatInt)}`,
    d.maskToken === null
      ? 'DFlash mask token: postprocess.dflash.maskToken is not set, not checked'
      : `DFlash mask token: ${d.maskToken.token} (id ${d.maskToken.id}), a special token no exported row holds`,
  ];
}
