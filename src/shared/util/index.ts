// Small helpers with one home each: files, JSON values, child processes and threads, formatting.
export {
  countLines,
  countNewlines,
  ensureDir,
  exists,
  fsyncDir,
  jsonText,
  type LinkMethod,
  linkOrCopy,
  readdirOrEmpty,
  removeAbandonedTempFiles,
  removeTempFiles,
  tempNameFor,
  writeFileAtomic,
} from './fs.js';
export { isErrno } from './errno.js';
export { formatDuration, formatInt } from './format.js';
export { isRecord } from './json.js';
export { startModuleThread } from './module-thread.js';
export { delay, withTimeout } from './timeout.js';
export { type CapturedRun, isProcessAlive, runCaptured } from './process.js';
