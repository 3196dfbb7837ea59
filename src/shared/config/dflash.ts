/** `postprocess.dflash`: what the data checks for DFlash drafters need to know (docs/training-data.md, DFlash). */
import { z } from 'zod';

/** Settings of DFlash's data checks. */
export const DflashConfigSchema = z.strictObject({
  maskToken: z
    .union(
      [
        z.string().min(1),
        z
          .number()
          .int()
          .nonnegative()
          .transform((n) => String(n)),
      ],
      { error: 'expected a token of the tokenizer (its text, e.g. "<|vision_pad|>") or a token id (e.g. 151669)' },
    )
    .describe(
      "The token DFlash fills a block's slots with (SpecForge's and speculators' mask token; the serving runtime must use the same id). Checked against the tokenizer by `tokenmill config -c`, each merge and `export --drafter dflash`: it must be in the vocabulary, a special token, and neither the pad, bos nor eos token nor one that ends an assistant turn; a merge refuses new rows that hold it, and `export --drafter dflash` refuses a dataset that does. For the bundled Qwen3 tokenizer `<|vision_pad|>` fits. An id (a number) past the tokenizer's vocabulary names the drafter's own mask row — 151669 for Qwen3, the `<|MASK|>` z-lab's drafts add and both trainers pick when unset: no text encodes to it, so it passes.",
    ),
});

/** The `postprocess.dflash` section. */
export type DflashConfig = z.infer<typeof DflashConfigSchema>;
