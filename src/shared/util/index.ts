// Small helpers with one home each: files, JSON values, child processes and threads, formatting.
export {
  ensureDir,
  exists,
  fsyncDir,
  isErrno,
  jsonText,
  type LinkMethod,
  linkOrCopy,
  readdirOrEmpty,
  removeTempFiles,
  writeFileAtomic,
} from './fs.js';
export { formatDuration, formatInt } from './format.js';
export { isRecord } from './json.js';
export { startModuleThread } from './module-thread.js';
export { withTimeout } from './timeout.js';
export { type CapturedRun, isProcessAlive, runCaptured } from './process.js';
