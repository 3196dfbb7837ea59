// Tool calls: reading the model's calls in its family's format, reading the source's calls, and
// deciding whether the source's tool results answer a regenerated turn.
export { detectToolCallFormat } from './detect.js';
export { matchSourceResults, type SourceResultsMatch, type SourceTurn } from './match.js';
export { callArgumentsObject, parseToolCalls, type ParseToolCallsOptions } from './parse.js';
export { sourceCalls, type SourceCall } from './source-calls.js';
export { TOOL_CALL_FORMATS, type ParsedTurn, type ToolCall, type ToolCallFormat } from './types.js';
export { definedToolNames, undefinedToolCall } from './undefined-call.js';
