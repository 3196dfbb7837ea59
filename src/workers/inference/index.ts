// The inference stage: the BullMQ worker that sends prompts to SGLang under the budgets and caps.
export { InferenceWorker } from './worker.js';
export { endCause } from './conversation-store.js';
