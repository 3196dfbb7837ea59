// Runs in every test worker before the test files: logs at `error` unless
// TOKENMILL_TEST_LOG_LEVEL says otherwise, so test output stays readable.
import { createRootLogger } from '../../src/shared/index.js';

createRootLogger({ level: process.env['TOKENMILL_TEST_LOG_LEVEL'] ?? 'error' });
