// The embedded redis-server's files: the config it is started with, the small run files (pid,
// port, lock) and its log (embedded-redis.ts).
import { promises as fs } from 'node:fs';
import { errorMessage } from '../errors.js';
import { HOST } from './embedded-redis-probe.js';

export function renderConfig(dataDir: string, port: number): string {
  return [
    '# Written by tokenmill at each start of its embedded redis-server; edits are overwritten.',
    `bind ${HOST}`,
    'protected-mode yes',
    `port ${port}`,
    'daemonize no',
    `dir ${quoteConfigValue(dataDir)}`,
    'logfile ""',
    'save ""',
    'appendonly yes',
    'appendfsync everysec',
    'maxmemory-policy noeviction',
    '',
  ].join('\n');
}

/** Quotes a value for redis.conf (parsed like a shell word: double quotes, backslash escapes). */
export function quoteConfigValue(value: string): string {
  return `"${value.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`;
}

export async function readIntFile(file: string): Promise<number | undefined> {
  try {
    const text = (await fs.readFile(file, 'utf8')).trim();
    return /^\d+$/.test(text) ? Number(text) : undefined;
  } catch {
    return undefined;
  }
}

export async function fileSize(file: string): Promise<number> {
  try {
    return (await fs.stat(file)).size;
  } catch {
    return 0;
  }
}

export async function mtimeMs(file: string): Promise<number> {
  try {
    return (await fs.stat(file)).mtimeMs;
  } catch {
    return Date.now();
  }
}

/** The last lines the server wrote since `fromOffset`. */
export async function readLogTail(file: string, fromOffset: number, maxLines = 20, maxBytes = 8_192): Promise<string> {
  try {
    const size = await fileSize(file);
    const start = Math.max(fromOffset, size - maxBytes);
    const handle = await fs.open(file, 'r');
    try {
      const buffer = Buffer.alloc(size - start);
      await handle.read(buffer, 0, buffer.length, start);
      const lines = buffer
        .toString('utf8')
        .split('\n')
        .filter((l) => l.trim() !== '');
      return lines.length === 0 ? '(empty log)' : lines.slice(-maxLines).join('\n');
    } finally {
      await handle.close();
    }
  } catch (e: unknown) {
    return `(log unreadable: ${errorMessage(e)})`;
  }
}

export function indent(text: string): string {
  return text
    .split('\n')
    .map((l) => `  ${l}`)
    .join('\n');
}
