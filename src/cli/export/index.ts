// `tokenmill export`: training rows and SpecForge conversations written out of a run.
export { AtomicJsonlWriter } from './file.js';
export { exportRows, type RowsExportStats } from './rows.js';
export { exportSpecForgeDataset, type SpecForgeExportStats } from './specforge.js';
