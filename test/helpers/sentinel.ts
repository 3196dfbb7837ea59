// Redis with Sentinel on loopback for the fault suite: a primary, a replica (`replicaof`) and three
// Sentinels (`redis-server --sentinel`), each a real redis-server on a free port with its folder in
// a temp dir, all killed by stop().
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Redis } from 'ioredis';
import { findFreePort } from '../../src/shared/index.js';
import { waitFor } from './pipeline.js';

export interface SentinelNode {
  port: number;
  child: ChildProcess;
}

export interface SentinelCluster {
  /** The master name the Sentinels monitor. */
  name: string;
  primary: SentinelNode;
  replica: SentinelNode;
  sentinels: SentinelNode[];
  /** `["127.0.0.1:<port>", …]`, as `redis.sentinels` takes them. */
  addresses: string[];
  /** The primary's port as the Sentinels name it now. */
  masterPort(): Promise<number>;
  /** `run_id` from INFO server of the Redis on `port`. */
  runId(port: number): Promise<string>;
  stop(): Promise<void>;
}

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of live) c.kill('SIGKILL');
});

function start(args: string[], dir: string): ChildProcess {
  const child = spawn('redis-server', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  child.stderr?.resume();
  live.add(child);
  child.once('exit', () => live.delete(child));
  return child;
}

async function ask<T>(port: number, f: (r: Redis) => Promise<T>): Promise<T> {
  const r = new Redis({
    host: '127.0.0.1',
    port,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 2_000,
  });
  r.on('error', () => undefined);
  try {
    await r.connect();
    return await f(r);
  } finally {
    r.disconnect();
  }
}

async function answers(port: number): Promise<boolean> {
  return ask(port, async (r) => (await r.ping()) === 'PONG').catch(() => false);
}

/**
 * Starts the primary, the replica and three Sentinels (`sentinel monitor <name> … 2`,
 * `down-after-milliseconds` and `failover-timeout` as given), and waits until every Sentinel
 * knows the replica and the other two.
 */
export async function startSentinelCluster(
  dir: string,
  options: { name?: string; downAfterMs?: number; failoverTimeoutMs?: number } = {},
): Promise<SentinelCluster> {
  const name = options.name ?? 'tm-primary';
  const ports: number[] = [];
  while (ports.length < 5) {
    const p = await findFreePort();
    if (p !== 6379 && p !== 26379 && !ports.includes(p)) ports.push(p);
  }
  const [primaryPort, replicaPort, ...sentinelPorts] = ports as [number, number, number, number, number];
  const server = (port: number, sub: string, extra: string[] = []): SentinelNode => {
    const d = path.join(dir, sub);
    mkdirSync(d, { recursive: true });
    const args = [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--dir',
      d,
      '--save',
      '',
      '--appendonly',
      'yes',
      '--maxmemory-policy',
      'noeviction',
      ...extra,
    ];
    return { port, child: start(args, d) };
  };
  const primary = server(primaryPort, 'primary');
  const replica = server(replicaPort, 'replica', ['--replicaof', '127.0.0.1', String(primaryPort)]);
  const nodes: SentinelNode[] = [primary, replica];
  const stop = async (): Promise<void> => {
    await Promise.all(
      nodes.map(
        (n) =>
          new Promise<void>((resolve) => {
            if (n.child.exitCode !== null || n.child.signalCode !== null) return resolve();
            n.child.once('exit', () => resolve());
            n.child.kill('SIGKILL');
          }),
      ),
    );
  };
  try {
    await waitFor(
      async () => (await answers(primaryPort)) && (await answers(replicaPort)),
      'primary and replica up',
      20_000,
      100,
    );
    await waitFor(
      () => ask(replicaPort, async (r) => /master_link_status:up/.test(await r.info('replication'))).catch(() => false),
      'the replica in sync',
      20_000,
      100,
    );
    const sentinels = sentinelPorts.map((port, i) => {
      const d = path.join(dir, `sentinel-${i}`);
      mkdirSync(d, { recursive: true });
      const conf = path.join(d, 'sentinel.conf');
      writeFileSync(
        conf,
        [
          `port ${port}`,
          'bind 127.0.0.1',
          `dir ${d}`,
          `sentinel monitor ${name} 127.0.0.1 ${primaryPort} 2`,
          `sentinel down-after-milliseconds ${name} ${options.downAfterMs ?? 1000}`,
          `sentinel failover-timeout ${name} ${options.failoverTimeoutMs ?? 5000}`,
          `sentinel parallel-syncs ${name} 1`,
          '',
        ].join('\n'),
      );
      const node = { port, child: start([conf, '--sentinel'], d) };
      nodes.push(node);
      return node;
    });
    await waitFor(
      async () => {
        for (const s of sentinels) {
          const ok = await ask(s.port, async (r) => {
            const replicas = (await r.call('SENTINEL', 'REPLICAS', name)) as unknown[];
            const others = (await r.call('SENTINEL', 'SENTINELS', name)) as unknown[];
            return replicas.length === 1 && others.length === 2;
          }).catch(() => false);
          if (!ok) return false;
        }
        return true;
      },
      'every Sentinel to know the replica and the other Sentinels',
      40_000,
      250,
    );
    return {
      name,
      primary,
      replica,
      sentinels,
      addresses: sentinels.map((s) => `127.0.0.1:${s.port}`),
      async masterPort() {
        for (const s of sentinels) {
          const addr = await ask(
            s.port,
            (r) => r.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', name) as Promise<[string, string]>,
          ).catch(() => undefined);
          if (addr !== undefined) return Number(addr[1]);
        }
        throw new Error('no Sentinel answers');
      },
      runId: (port) => ask(port, async (r) => /^run_id:(\S+)/m.exec(await r.info('server'))?.[1] ?? ''),
      stop,
    };
  } catch (e: unknown) {
    await stop();
    throw e;
  }
}
