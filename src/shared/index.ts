// The public surface of src/shared: producers, workers, the dashboard and the CLI import
// only from here.
export * from './errors.js';
export * from './logger.js';
