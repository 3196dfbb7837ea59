// Tokenizer: the target model's chat template and encoder (Hugging Face, tiktoken or the server's).
export { parseRankFile, type RankTable, readRankFile } from './bpe.js';
export { BUNDLED_TOKENIZER_MODEL, bundledTokenizerPath } from './bundled.js';
export { ChatTokenizer, type TokenIdRange } from './chat.js';
export { checkDflashMaskToken, DFLASH_MASK_TOKEN_KEY, type DflashMaskToken } from './dflash-mask-token.js';
export { type EncoderKind, ServerTokensNeededError, type TokenEncoder } from './encoder.js';
export {
  checkTokenizerKindFits,
  loadConfiguredTokenizer,
  loadTokenizer,
  type TokenizerConfigSource,
  type TokenizerKind,
  tokenizerLoadOptions,
  type TokenizerLoadOptions,
} from './load.js';
export {
  type ApplyChatTemplateOptions,
  type ChatMessage,
  ChatMessageSchema,
  type ChatRole,
  ChatRoleSchema,
  type EncodePromptOptions,
  type PromptToEncode,
} from './messages.js';
export { convertSplitPattern, KIMI_K2_PATTERN, O200K_PATTERN } from './pattern.js';
export { ServerTokenizeClient, type ServerTokenizeOptions } from './server-client.js';
export { ServerEncoder } from './server.js';
export { type TokenizerPreset } from './tiktoken.js';
export {
  answerMessage,
  answerTextWithSpecials,
  renderTurnPrompt,
  type RegeneratedAnswer,
  type TurnPrompt,
  type TurnRenderInput,
} from './turns.js';
