import { AppError, CancelledError } from '../../shared/index.js';

/** The job was cancelled (`tokenmill train --cancel`). Never retried. */
export class TrainCancelledError extends AppError {
  constructor(message: string) {
    super(message, { retryable: false });
  }
}

/** Whether an error means "cancelled" (for the status' state). */
export function isCancel(e: unknown): boolean {
  return e instanceof TrainCancelledError || e instanceof CancelledError;
}
