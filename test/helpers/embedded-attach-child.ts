// A process that attaches to (or starts) the embedded redis-server of a data folder, then uses
// it for a second: prints `attached <owns>` once started, then `ok` if every PING was answered,
// or `lost: <reason>` (exit 1). Used by embedded-redis-attach-race.test.ts.
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { EmbeddedRedis } from '../../src/shared/index.js';

const dataDir = process.argv[2];
if (dataDir === undefined) throw new Error('usage: embedded-attach-child.ts <dataDir>');
const server = new EmbeddedRedis({ dataDir, keepWhileInUse: true, logger: pino({ level: 'silent' }) });
const { url } = await server.start();
process.stdout.write(`attached ${server.ownsProcess ? 'owner' : 'attached'}\n`);
const conn = new Redis(url, { maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null });
conn.on('error', () => undefined);
let code = 0;
try {
  await new Promise((r) => conn.once('ready', r));
  for (let i = 0; i < 10; i++) {
    await Promise.race([
      conn.ping(),
      new Promise((_, reject) => setTimeout(() => reject(new Error('PING not answered in 2 s')), 2_000)),
    ]);
    await new Promise((r) => setTimeout(r, 100));
  }
  process.stdout.write('ok\n');
} catch (e: unknown) {
  process.stdout.write(`lost: ${e instanceof Error ? e.message : String(e)}\n`);
  code = 1;
} finally {
  conn.disconnect();
  await server.stop();
}
process.exit(code);
