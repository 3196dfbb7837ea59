// DFlash's mask token checked against the tokenizer: DFlash fills the slots of a draft block
// with it, so the model must never see it as a real token. It must be a reserved special token:
// in the vocabulary, special, and not one that rows carry anyway (pad, bos, eos, end of turn).
// That the data never holds it is checked by the merge and the DFlash export, which read rows.
import { ConfigError } from '../errors.js';
import type { ChatTokenizer } from './chat.js';

/** The config key of DFlash's mask token. */
export const DFLASH_MASK_TOKEN_KEY = 'postprocess.dflash.maskToken';

/** A mask token that passed {@link checkDflashMaskToken}. */
export interface DflashMaskToken {
  token: string;
  id: number;
}

/**
 * `token` as DFlash's mask token of `tokenizer`: its id, or a {@link ConfigError} at
 * `postprocess.dflash.maskToken` saying what is wrong — not in the vocabulary, not a special
 * token, or the pad, bos or eos token or one that ends an assistant turn.
 */
export function checkDflashMaskToken(tokenizer: ChatTokenizer, token: string, file?: string): DflashMaskToken {
  const fail = (message: string): never => {
    throw new ConfigError([{ path: DFLASH_MASK_TOKEN_KEY, message }], file);
  };
  const of = `the tokenizer ${tokenizer.name} (${tokenizer.dir})`;
  // A number: a token id. One past the vocabulary is the drafter's own mask row (z-lab's <|MASK|>):
  // no text encodes to it, so no row can hold it.
  const byId = /^\d+$/.test(token) && tokenizer.tokenToId(token) === undefined ? Number(token) : undefined;
  if (byId !== undefined && byId >= tokenizer.vocabSize) return { token: `id ${byId}`, id: byId };
  const shown = byId === undefined ? JSON.stringify(token) : `id ${byId}`;
  const id = byId ?? tokenizer.tokenToId(token);
  if (id === undefined)
    return fail(
      `${shown} is not in the vocabulary of ${of}: name one of its special tokens, or an id past its vocabulary (${tokenizer.vocabSize} or more)`,
    );
  const named = (key: string): boolean => {
    const content = tokenizer.specialTokens[key];
    return content !== undefined && tokenizer.tokenToId(content) === id;
  };
  const which = byId === undefined ? `${shown} (id ${id})` : `id ${id} (${JSON.stringify(tokenizer.decode([id]))})`;
  if (named('pad_token'))
    fail(`${which} is the pad token of ${of}: padding would read as mask slots; choose a reserved special token`);
  if (id === tokenizer.eosTokenId || named('eos_token'))
    fail(`${which} is the eos token of ${of}: every answer ends with it; choose a reserved special token`);
  if (tokenizer.endOfTurnTokenIds.includes(id))
    fail(`${which} ends an assistant turn in ${of}: answers hold it; choose a reserved special token`);
  if (id === tokenizer.bosTokenId || named('bos_token'))
    fail(`${which} is the bos token of ${of}: rows start with it; choose a reserved special token`);
  if (!tokenizer.isSpecialTokenId(id))
    fail(
      `${which} is not a special token of ${of}: text can encode to it; choose a reserved special token (one marked special)`,
    );
  return { token, id };
}
