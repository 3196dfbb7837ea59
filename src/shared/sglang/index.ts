// SGLang HTTP client: one SglangClient per endpoint, typed errors, zod-parsed responses.
// Named exports only, so that generic helper names stay private to this folder.
export {
  SglangClient,
  type SglangClientOptions,
  type SglangGenerateRequest,
  type SglangChatRequest,
  type HealthResult,
} from './client.js';
export {
  EndpointMisconfiguredError,
  isEndpointLevelStatus,
  SglangBadRequestError,
  SglangResponseFormatError,
  type SglangRequestContext,
  classifyResponse,
  classifyTransportError,
  errorCode,
  sglangErrorMessage,
} from './errors.js';
export {
  SglangSamplingParamsSchema,
  type SglangSamplingParams,
  FinishReasonSchema,
  type FinishReason,
  GenerateMetaInfoSchema,
  GenerateResponseSchema,
  type GenerateResponse,
  type GenerateResult,
  type ChatMessageInput,
  ChatCompletionResponseSchema,
  type ChatCompletionResponse,
  type ChatFinishReason,
  type ChatResult,
  ModelInfoSchema,
  type ModelInfo,
  ServerInfoSchema,
  type ServerInfo,
  LoadInfoSchema,
  type LoadInfo,
  parseGenerateResponse,
  parseChatResponse,
} from './schemas.js';
