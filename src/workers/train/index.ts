// The train stage: GPU workers that run the configured trainer on the merged dataset.
export { listAttempts, listCheckpoints, trainDir } from './attempts.js';
export { describeHiddenStatesAtQueue } from './hidden-states.js';
export {
  type CancelledJob,
  cancelTrainJobs,
  queueTrainJob,
  roundTrainJobId,
  type TrainOutcomeSeen,
  trainPayloadOf,
  waitForTrainJob,
  withTrainParent,
} from './train-jobs.js';
export { TrainWorker, type TrainWorkerOptions } from './worker.js';
