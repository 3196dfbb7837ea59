/**
 * What a source reader gives `tokenmill prepare`: one row at a time, already in chat shape, or
 * the reason it could not be read, with where it is (file and row, line for JSONL).
 */
import type { PromptSource } from '../../shared/index.js';

/** A chat role of a prepared prompt. */
export type ChatRole = 'system' | 'user' | 'assistant' | 'tool';

/** One turn; keys other than `role`/`content` (e.g. `tool_calls`) are kept as the source had them. */
export interface SourceMessage {
  role: ChatRole;
  content: string;
  [key: string]: unknown;
}

/** Where a row is: its file, its 0-based row in that file and, for JSONL, its 1-based line. */
export interface SourceRowWhere {
  file: string;
  row: number;
  line?: number;
}

/**
 * A row of a source: its turns as the source has them (trailing assistant turns included) and its
 * tool schemas (`tools` / `functions`, read as tool-schemas.ts of src/shared/prompts says), or why
 * it is malformed.
 */
export type SourceRow =
  | { ok: true; id?: string; messages: SourceMessage[]; tools?: unknown[]; where: SourceRowWhere }
  | { ok: false; reason: string; where: SourceRowWhere; excerpt?: string };

/** The formats a source can have once `auto` is resolved. */
export type SourceFormat = Exclude<PromptSource['format'], 'auto'>;

/** An opened source: its files, its format (and, when detected, from what) and its rows, streamed. */
export interface OpenedSource {
  /** The files read, in the order their rows come (sorted; a `save_to_disk` folder's shards in state.json order). */
  files: string[];
  format: SourceFormat;
  /** With `format: auto`: what the format was detected from, e.g. `columns conversations[].from/value in the first row`. */
  detectedFrom?: string;
  /** What was chosen on the way, to report: e.g. the `train` split of a DatasetDict, or of a folder of several splits. */
  notes?: string[];
  /** Rows in file order; read once. Memory stays bounded whatever the size of the files. */
  rows(): AsyncIterable<SourceRow>;
}
