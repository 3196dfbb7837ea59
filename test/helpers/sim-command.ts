// `tokenmill sim …` as a command line that runs from any folder (the CLI from source, tsx resolved
// from here): the server command of eval.server in the tests.
import path from 'node:path';
import { repoRoot } from './pipeline.js';

/** `node --import <tsx> src/cli/main.ts sim <args>`. */
export function simCommand(...args: string[]): string[] {
  return [
    process.execPath,
    '--import',
    import.meta.resolve('tsx'),
    path.join(repoRoot, 'src/cli/main.ts'),
    'sim',
    ...args,
  ];
}
