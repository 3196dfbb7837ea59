// Where two token sequences (or training rows) first differ, shown with the tokens around it: the
// failure messages of the parity tests.
import type { ChatTokenizer } from '../../src/shared/tokenizer/index.js';

/** A row's ids and loss mask. */
export interface MaskedIds {
  input_ids: readonly number[];
  loss_mask: readonly number[];
}

/** Where two strings first differ, by UTF-16 index, with context; empty when equal. */
export function textDifference(ts: string, py: string): string {
  if (ts === py) return '';
  let i = 0;
  while (i < ts.length && i < py.length && ts[i] === py[i]) i++;
  const from = Math.max(0, i - 30);
  return `rendered text differs at char ${i}: ts ${JSON.stringify(ts.slice(from, i + 30))} python ${JSON.stringify(py.slice(from, i + 30))}`;
}

/** Where two id lists first differ, with the tokens around it; empty when equal. */
export function idsDifference(tok: ChatTokenizer, ts: readonly number[], py: readonly number[]): string {
  let i = 0;
  while (i < ts.length && i < py.length && ts[i] === py[i]) i++;
  if (i === ts.length && i === py.length) return '';
  const show = (ids: readonly number[]): string =>
    ids
      .slice(Math.max(0, i - 4), i + 5)
      .map((id) => `${JSON.stringify(tok.decode([id]))}#${id}`)
      .join(' ');
  return `first difference at ${i} (lengths ts ${ts.length}, python ${py.length})\n  ts:     ${show(ts)}\n  python: ${show(py)}`;
}

/** Where two rows first differ (an id, a mask value or a length), with the tokens and mask values around it; empty when equal. */
export function rowDifference(tok: ChatTokenizer, ts: MaskedIds, py: MaskedIds): string {
  const n = Math.max(ts.input_ids.length, py.input_ids.length, ts.loss_mask.length, py.loss_mask.length);
  let i = 0;
  while (i < n && ts.input_ids[i] === py.input_ids[i] && ts.loss_mask[i] === py.loss_mask[i]) i++;
  if (i === n) return '';
  const from = Math.max(0, i - 4);
  const show = (ids: readonly number[], mask: readonly number[]): string =>
    ids
      .slice(from, i + 5)
      .map((id, k) => `${JSON.stringify(tok.decode([id]))}#${id}:${mask[from + k] ?? '?'}`)
      .join(' ');
  return (
    `first difference at ${i} (lengths ts ${ts.input_ids.length}/${ts.loss_mask.length}, python ` +
    `${py.input_ids.length}/${py.loss_mask.length})\n  ts:     ${show(ts.input_ids, ts.loss_mask)}\n  python: ${show(py.input_ids, py.loss_mask)}`
  );
}
