// Small helpers with one home each: files, JSON values, child processes and threads, formatting.
export { ensureDir, exists, fsyncDir, isErrno, jsonText, type LinkMethod, linkOrCopy, readdirOrEmpty, removeTempFiles, writeFileAtomic } from './fs.js';
export { startModuleThread } from './module-thread.js';
export { type CapturedRun, runCaptured } from './run-captured.js';
