// The SGLang simulator used by the demo, the tests and the benchmarks (`tokenmill sim`).
export { startSimulator, Simulator } from './simulator.js';
export type { SimulatorOptions, SimulatorHandle, SimStats, SimRequestRecord, SimVersion } from './types.js';
export { SIM_VERSIONS } from './types.js';
export { BAD_ANSWERS, type BadAnswer, type FaultConfig, type FaultKind, FaultInjector, NO_FAULTS, sampleKeyOfRid, validateFaults } from './faults.js';
export {
  type Clock,
  type LoadJob,
  type LoadModelConfig,
  type LoadSnapshot,
  LoadModel,
  VirtualClock,
  batchThroughput,
  realClock,
} from './load-model.js';
export { type OutputLengthSpec, DEFAULT_OUTPUT_LENGTH } from './output-model.js';
