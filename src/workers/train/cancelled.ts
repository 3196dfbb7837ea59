import { JobCancelledError } from '../gpu/index.js';

/** The train job was cancelled (`tokenmill train --cancel`). Never retried. */
export class TrainCancelledError extends JobCancelledError {}
