/**
 * The tokenize step of post-processing: turns a dataset's generation records, or an existing
 * conversation dataset, into training rows `{id, dataset, input_ids, loss_mask, num_tokens,
 * finish_reason}` for EAGLE-3 / DFlash drafter trainers. The rules of both paths (token-exact rows
 * from generation records, SpecForge's loss mask for conversations) are in docs/design.md,
 * Training rows (tokenize).
 */
export { deriveAssistantTurnFormat, type AssistantTurnFormat, type TurnFormatOptions } from './tokenize-template.js';
export { findSupervisedSpans, maskFromSpans, type CharSpan } from './tokenize-mask.js';
export * from './tokenize-context.js';
export { type InvalidLine } from './tokenize-lines.js';
export * from './tokenize-records.js';
export * from './tokenize-conversations.js';
