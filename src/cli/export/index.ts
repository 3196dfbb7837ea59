// `tokenmill export`: training rows and SpecForge conversations written out of a run.
export {
  DflashRows,
  DRAFTERS,
  formatDflashExport,
  parseDrafter,
  type DflashExportStats,
  type Drafter,
} from './dflash-rows.js';
export { AtomicJsonlWriter } from './file.js';
export { exportRows, type RowsExportStats } from './rows.js';
export { exportSpecForgeDataset, type SpecForgeExportStats } from './specforge.js';
export { allTurnsPath, sidecarPath, SpecForgeOutput, type SpecForgeFileReport } from './specforge-files.js';
export {
  exportSpecForgeRun,
  formatSpecForgeResult,
  reencodeSentence,
  type SpecForgeRunResult,
} from './specforge-run.js';
export { matchSpecForgeTemplate, SPECFORGE_TEMPLATES, type SpecForgeTemplate } from './specforge-templates.js';
export {
  exportSpeculators,
  formatSpeculatorsExport,
  SPECULATORS_COLUMNS,
  type SpeculatorsExportOptions,
  type SpeculatorsExportStats,
  speculatorsTrainCommand,
  TOKEN_FREQ_FILE,
  verifierOf,
} from './speculators.js';
export { inspectOut, type OutState } from './speculators-dir.js';
export { partitionOf, partitionsFor, PromptIndex, promptIdOf, type SampleIdScheme } from './prompt-index.js';
export { pickleIntDict } from './torch-pickle.js';
export { archiveNameOf, torchSaveIntDict, torchSaveIntDictBytes } from './torch-save.js';
export { paddingFor, storedZip, type ZipEntry } from './torch-zip.js';
