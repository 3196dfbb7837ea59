// Prepare: source datasets (JSONL, JSON, Parquet, Arrow, HF folders) to prompt files.
export { formatPrepareCounts, type PrepareCounts } from './prepare-report.js';
export { startRunOver } from './prepare-run-guard.js';
export { type DatasetPrepareOutcome, prepareSources, sourcedDatasets } from './prepare.js';
