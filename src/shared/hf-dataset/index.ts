// Hugging Face `datasets` on-disk format: writing, reading, merging with validation, rollback.
export * from './schema.js';
export * from './writer.js';
export * from './reader.js';
export * from './merge/merge.js';
export { DEFAULT_PYTHON, pythonVerifier, type PythonVerifier } from './merge/verify-python.js';
export { exists, linkOrCopy, writeFileAtomic, type LinkMethod } from '../util/fs.js';
