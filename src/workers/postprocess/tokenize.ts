/**
 * The tokenize step of post-processing: turns a dataset's generation records, or an existing
 * conversation dataset, into training rows `{id, dataset, input_ids, loss_mask, num_tokens,
 * finish_reason}` for EAGLE-3 / DFlash drafter trainers (reference/training-data.md).
 *
 * ## Generation records (token-exact)
 * A record holds the prompt's ids as sent to SGLang (the conversation rendered with
 * `add_generation_prompt=True` and encoded once) and SGLang's `output_ids`. The row is
 * `prompt_ids + output_ids + suffix`, mask 0 on the prompt and 1 on the output and the suffix,
 * where `suffix` is what the chat template writes after the end-of-turn token of an assistant
 * turn ({@link assistantTurnSuffix}; `\n` for Qwen-style templates, nothing for DeepSeek-V3).
 * Nothing is re-tokenized: the row holds exactly the ids the target model read and wrote.
 * Only this generation is supervised: assistant turns inside the prompt are context (0).
 * By finish reason ({@link recordToRow}):
 * - `stop` and the output ends with the template's end-of-turn token (`<|im_end|>`): kept, with
 *   the suffix — the same ids and mask as rendering the finished conversation gives;
 * - `stop` on anything else — a stop string, a `stop_token_ids` entry, or another end token
 *   such as Qwen's `<|endoftext|>`: kept exactly as generated, with no suffix (the template
 *   writes its suffix only after its own end-of-turn token, and appending one would put ids in
 *   the data that the model did not produce); counted in `stopWithoutEndOfTurn`;
 * - `length` (truncated, no end-of-turn token): dropped, unless `keepTruncated`, then kept with
 *   no suffix and `finish_reason` `"length"`;
 * - `abort` (a partial output: `budget: strict` stopped it at the budget, or the server aborted
 *   it): like `length`, dropped unless `keepTruncated`, then kept with `finish_reason` `"abort"`.
 *
 * Qwen3 note: rendering a finished conversation whose last assistant message has no reasoning
 * inserts an empty `<think>\n\n</think>\n\n` block after the assistant header. tokenmill
 * records what the model generated after the generation prompt it was given: with thinking on,
 * the model writes its own `<think>…</think>` block and the row equals the rendering (the
 * template would only drop newlines the model put around its reasoning or before its answer); with
 * `enable_thinking: false`, the empty block is part of the generation prompt (mask 0), and the
 * row again equals the rendering, with the block unsupervised as in conversation rows. A
 * thinking-mode output that skipped the block is kept as generated, and then differs from the
 * re-rendered conversation by exactly that block.
 *
 * ## Conversations ({@link conversationToRow})
 * The whole conversation is rendered once with the chat template (`add_generation_prompt`
 * false) and encoded once (`add_special_tokens` false, literal special-token text becomes the
 * special token, as in transformers). The loss mask is SpecForge's (`GeneralParser`, see
 * tokenize-mask.ts): 1 on the tokens from `len(encode(text[:start]))` to
 * `len(encode(text[:end]))` of each supervised span, where the supervised spans are found in the
 * rendered text from the template's own {@link AssistantTurnFormat} (derived by rendering probe
 * conversations, see tokenize-template.ts):
 * - each occurrence of the assistant header (`<|im_start|>assistant\n`) opens a span just after
 *   it; the span runs through the first turn end after that (`<|im_end|>\n`: the end-of-turn
 *   token and what the template writes after it), inclusive, or to the end of the text;
 * - the template's ignorable text (Qwen3's empty `<think>\n\n</think>\n\n`, which it inserts
 *   after the header of a turn without reasoning) is not supervised, wherever it appears;
 * - everything else — system, user and tool turns, assistant headers, the BOS — is 0.
 * So for Qwen the supervised tokens of a turn are its reasoning block when present, the
 * content, tool calls, `<|im_end|>` and `\n`. A token that straddles a span start (Qwen's
 * pre-tokenizer can merge the header's `\n` with a leading newline of the content) is 0, as in
 * SpecForge.
 * The rule works on the rendered text, as SpecForge's `GeneralParser` does, so: assistant
 * content holding the literal turn end (`<|im_end|>\n`) ends its span there; text in any turn
 * holding the literal header opens a span; and templates that write no header before an
 * assistant turn (DeepSeek-V3 after tool outputs) leave that turn unsupervised. The parity test
 * (test/integration/tokenize-python.test.ts, test/integration/model-parity.test.ts) checks ids
 * and mask against an independent Python implementation of SpecForge's rule on transformers.
 */
export { deriveAssistantTurnFormat, type AssistantTurnFormat, type TurnFormatOptions } from './tokenize-template.js';
export { findSupervisedSpans, maskFromSpans, type CharSpan } from './tokenize-mask.js';
export * from './tokenize-context.js';
export { type InvalidLine } from './tokenize-lines.js';
export * from './tokenize-records.js';
export * from './tokenize-conversations.js';
