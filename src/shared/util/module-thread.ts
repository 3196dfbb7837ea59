import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';

/**
 * Starts a worker thread on the module `<name>.js` beside `callerUrl` (the caller's
 * `import.meta.url`). Running from source (tests, `tsx`), the `.ts` entry is imported through
 * tsx's API instead: a worker does not inherit the main thread's TypeScript loader.
 */
export function startModuleThread(callerUrl: string, name: string, workerData: unknown): Worker {
  if (!callerUrl.endsWith('.ts')) return new Worker(new URL(`./${name}.js`, callerUrl), { workerData });
  const entry = new URL(`./${name}.ts`, callerUrl).href;
  // tsx's `./esm/api` export, import condition (require.resolve would give its CommonJS build).
  const tsxDir = path.dirname(createRequire(callerUrl).resolve('tsx/package.json'));
  const api = pathToFileURL(path.join(tsxDir, 'dist', 'esm', 'api', 'index.mjs')).href;
  const code = `import(${JSON.stringify(api)}).then((tsx) => tsx.tsImport(${JSON.stringify(entry)}, ${JSON.stringify(entry)}));`;
  return new Worker(code, { eval: true, workerData });
}
