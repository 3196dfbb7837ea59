import { SourceOffsetsSchema, readHfDataset, type HfRow, type Logger, type SourceOffsets } from '../../shared/index.js';

/** The offsets the round's tokenize jobs returned beside their results (generation datasets). */
export function sourceOffsetsOf(values: readonly unknown[], log: Logger): SourceOffsets[] {
  const out: SourceOffsets[] = [];
  for (const v of values) {
    const raw = typeof v === 'object' && v !== null ? (v as { sourceOffsets?: unknown }).sourceOffsets : undefined;
    if (raw === undefined) continue;
    const parsed = SourceOffsetsSchema.safeParse(raw);
    if (parsed.success) out.push(parsed.data);
    else
      log.warn(
        { issues: parsed.error.issues.slice(0, 3) },
        'a tokenize job returned offsets that do not parse: its lines are read again next round',
      );
  }
  return out;
}

/** Every row of the staged folders, in order. */
export async function* stagedRows(dirs: readonly string[]): AsyncGenerator<HfRow> {
  for (const dir of dirs) {
    const ds = await readHfDataset(dir);
    for await (const row of ds.rows()) yield row as unknown as HfRow;
  }
}
