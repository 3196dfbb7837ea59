/**
 * Resolves a source's format and layout from its config and its first rows: `format: auto`
 * is detected (turn lists first, then `alpaca`, then one well-known text column) and said
 * where from; an explicit format takes its defaults, `fields` and, for `openai` or `sharegpt`
 * without `fields.messages`, the list column the rows have (`messages` or `conversations`).
 */
import { isRecord, type PromptSource } from '../../shared/index.js';
import { PROMPT_COLUMNS, layoutOf, typeName, type SourceLayout } from './source-formats.js';
import { SourceError, describeWhere } from './source-raw.js';
import type { SourceRowWhere } from './source-types.js';

/** A readable row from the start of a source, used to detect its format. */
export interface SampleRow {
  value: Record<string, unknown>;
  where: SourceRowWhere;
}

/** How many rows from the start of a source the detection looks at. */
export const SAMPLE_ROWS = 20;

/** Columns that may hold a list of turns when `fields.messages` is not set, in order. */
const TURN_COLUMNS = ['messages', 'conversations', 'conversation'] as const;

/** The resolved layout and, for `auto`, what the format was detected from. */
export interface ResolvedLayout {
  layout: SourceLayout;
  detectedFrom?: string;
}

/**
 * The layout of a source from its config and first rows. Throws a {@link SourceError} when
 * `auto` cannot decide, naming the columns it saw and what to set.
 */
export function resolveLayout(source: PromptSource, samples: readonly SampleRow[], describe: string): ResolvedLayout {
  if (source.format !== 'auto') {
    const candidates =
      source.format === 'openai'
        ? ['messages', 'conversations']
        : source.format === 'sharegpt'
          ? ['conversations', 'messages']
          : [];
    const turnsColumn = source.fields?.messages === undefined ? findTurnColumn(samples, candidates) : undefined;
    return { layout: layoutOf(source.format, source, { turnsColumn }) };
  }
  if (source.field !== undefined || source.fields?.prompt !== undefined) {
    const key = source.field !== undefined ? 'field' : 'fields.prompt';
    return { layout: layoutOf('prompt', source), detectedFrom: `${key} is set` };
  }
  if (source.fields?.instruction !== undefined)
    return { layout: layoutOf('alpaca', source), detectedFrom: 'fields.instruction is set' };
  const first = samples[0];
  if (first === undefined) {
    throw new SourceError(
      `${describe}: cannot detect the format: no readable row in the first ${SAMPLE_ROWS}; set format (openai, sharegpt, alpaca or prompt)`,
    );
  }
  const turns = detectTurns(source, samples, describe);
  if (turns !== undefined) return turns;
  const instruction = samples.find((s) => typeof s.value.instruction === 'string');
  if (instruction !== undefined) {
    const out = ['input', 'output', 'response'].filter((c) => c in instruction.value);
    return {
      layout: layoutOf('alpaca', source),
      detectedFrom: `column instruction${out.length > 0 ? ` with ${out.join('/')}` : ''} in ${rowName(instruction, samples)}`,
    };
  }
  const textsOf = (s: SampleRow): string[] => PROMPT_COLUMNS.filter((c) => typeof s.value[c] === 'string');
  const withText = samples.find((s) => textsOf(s).length > 0) ?? first;
  const texts = textsOf(withText);
  if (texts.length === 1) {
    const prompt = texts[0] as string;
    return {
      layout: layoutOf('prompt', source, { prompt }),
      detectedFrom: `text column ${prompt} in ${rowName(withText, samples)}`,
    };
  }
  const seen = `columns seen in ${describeWhere(withText.where)}: ${columnsWithTypes(withText.value)}`;
  if (texts.length > 1) {
    throw new SourceError(
      `${describe}: cannot detect the format: several text columns could be the prompt (${texts.join(', ')}); set field to the one to use (${seen})`,
    );
  }
  throw new SourceError(
    `${describe}: cannot detect the format (${seen}); set format: prompt with field: <text column>, or format: openai|sharegpt with fields.messages/role/content, or format: alpaca with fields.instruction`,
  );
}

/** The first of `candidates` that is a list in one of the sample rows. */
function findTurnColumn(samples: readonly SampleRow[], candidates: readonly string[]): string | undefined {
  for (const s of samples) for (const c of candidates) if (Array.isArray(s.value[c])) return c;
  return undefined;
}

/** `openai` or `sharegpt` when a row has a list of turns whose keys say which; undefined when no row has a list of turns. */
function detectTurns(
  source: PromptSource,
  samples: readonly SampleRow[],
  describe: string,
): ResolvedLayout | undefined {
  const f = source.fields ?? {};
  const candidates = f.messages !== undefined ? [f.messages] : TURN_COLUMNS;
  let listSeen: { column: string; keys: string[]; sample: SampleRow } | undefined;
  for (const sample of samples) {
    for (const column of candidates) {
      const list = sample.value[column];
      if (!Array.isArray(list)) continue;
      const turn = (list as unknown[]).find(isRecord);
      if (turn === undefined) {
        listSeen ??= { column, keys: [], sample };
        continue;
      }
      const keys = Object.keys(turn);
      const has = (k: string): boolean => keys.includes(k);
      const where = rowName(sample, samples);
      if (has(f.role ?? 'role') && has(f.content ?? 'content')) {
        return {
          layout: layoutOf('openai', source, { turnsColumn: column }),
          detectedFrom: `column ${column}[].${f.role ?? 'role'}/${f.content ?? 'content'} in ${where}`,
        };
      }
      if (has(f.role ?? 'from') && has(f.content ?? 'value')) {
        const layout = layoutOf('sharegpt', source);
        return {
          layout: { ...layout, messages: column },
          detectedFrom: `column ${column}[].${layout.role}/${layout.content} in ${where}`,
        };
      }
      listSeen = { column, keys, sample };
      break;
    }
    if (listSeen !== undefined && listSeen.keys.length > 0) break;
  }
  if (listSeen === undefined) {
    if (f.messages !== undefined) {
      const first = samples[0] as SampleRow;
      throw new SourceError(
        `${describe}: fields.messages is "${f.messages}" but ${describeWhere(first.where)} has no list there (columns: ${columnsWithTypes(first.value)})`,
      );
    }
    return undefined;
  }
  if (listSeen.keys.length === 0) {
    throw new SourceError(
      `${describe}: cannot detect the format: column ${listSeen.column} holds no turn objects in the first ${samples.length} rows; set format (openai or sharegpt)`,
    );
  }
  throw new SourceError(
    `${describe}: cannot detect the format: the turns of column ${listSeen.column} in ${describeWhere(listSeen.sample.where)} have keys ${listSeen.keys.join(', ')}, ` +
      'neither role/content (openai) nor from/value (sharegpt); set fields.role and fields.content to the keys of the role and the text',
  );
}

/** `the first row` or `row 3`. */
function rowName(sample: SampleRow, samples: readonly SampleRow[]): string {
  return sample === samples[0] ? 'the first row' : describeWhere(sample.where);
}

/** `id (a string), conversations (a list)`. */
export function columnsWithTypes(row: Record<string, unknown>): string {
  const keys = Object.keys(row);
  if (keys.length === 0) return 'none';
  return keys.map((k) => `${k} (${typeName(row[k])})`).join(', ');
}
