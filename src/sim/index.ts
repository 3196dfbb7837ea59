// The SGLang simulator used by the demo, the tests and the benchmarks (`tokenmill sim`).
export { type AnnouncedAcceptance, SIM_ANNOUNCEMENT_KEY, type SimAnnouncement, simAnnouncement } from './announce.js';
export {
  BAD_ANSWERS,
  type BadAnswer,
  type FaultConfig,
  FaultInjector,
  type FaultKind,
  NO_FAULTS,
  sampleKeyOfRid,
  validateFaults,
} from './faults.js';
export {
  batchThroughput,
  type Clock,
  type LoadJob,
  LoadModel,
  type LoadModelConfig,
  type LoadSnapshot,
  realClock,
  VirtualClock,
} from './load-model.js';
export { DEFAULT_OUTPUT_LENGTH, OUTPUT_MODES, type OutputLengthSpec, type OutputMode } from './output-model.js';
export { Simulator, startSimulator } from './simulator.js';
export {
  type AcceptanceSpec,
  DEFAULT_DRAFT_OVERHEAD,
  DEFAULT_NUM_STEPS,
  datasetOfRid,
  expectedAcceptLength,
  parseAcceptanceArg,
  ratesForMeanAcceptLength,
  SPECULATIVE_ALGORITHMS,
  type SpeculativeAlgorithm,
  type SpeculativeFlags,
  speculativeFromFlags,
  type SpeculativeOptions,
} from './speculative.js';
export {
  agentPlan,
  DEFAULT_TOOL_CALL_RATES,
  pythonJson,
  type SimCall,
  type ToolAnswer,
  type ToolCallOptions,
  type ToolCallRates,
  writeToolCalls,
} from './tool-calls.js';
export { type OfferedTool, readToolPrompt, type ToolPrompt } from './tool-prompt.js';
export {
  SIM_VERSIONS,
  type SimRequestRecord,
  type SimStats,
  type SimulatorHandle,
  type SimulatorOptions,
  type SimVersion,
} from './types.js';
