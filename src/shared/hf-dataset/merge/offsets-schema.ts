// The shapes of tokenize offsets (offsets.ts): what a tokenize job read, per generation file and
// per dataset, as the merge commits it.
import { z } from 'zod';

const count = z.number().int().nonnegative();

/** How far one generation file was read: complete lines only, with a fingerprint of what was read. */
export const GenerationFileOffsetSchema = z.object({
  /** Bytes of complete (newline-terminated) lines read. */
  bytes: count,
  /** Lines in those bytes (so line numbers of later lines stay right). */
  lines: count,
  /** sha1 of the first (up to) 4 KiB and of the last (up to) 4 KiB of those bytes. */
  head: z.string(),
  tail: z.string(),
});
export type GenerationFileOffset = z.infer<typeof GenerationFileOffsetSchema>;

/** How far one dataset's generations folder was read, and with which tokenize settings. */
export const DatasetOffsetsSchema = z.object({
  /** The generations folder read (for messages). */
  source: z.string(),
  /** The tokenize settings the lines were read with; other settings read everything again. */
  settings: z.string(),
  /** By file name in the folder. */
  files: z.record(z.string(), GenerationFileOffsetSchema),
});
export type DatasetOffsets = z.infer<typeof DatasetOffsetsSchema>;

/**
 * What a tokenize job read, to be committed by the merge: `basis` is the key of the training
 * dataset version it deduplicated against (null: no target yet). The merge records it only when
 * that version is still the current one.
 */
export const SourceOffsetsSchema = z.object({
  dataset: z.string().min(1),
  basis: z.string().nullable(),
  offsets: DatasetOffsetsSchema,
});
export type SourceOffsets = z.infer<typeof SourceOffsetsSchema>;
