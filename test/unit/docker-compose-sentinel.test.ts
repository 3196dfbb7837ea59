// deploy/docker-compose.sentinel.yml, checked without a Docker engine: it parses as YAML, its
// Sentinels monitor the master name that the redis section in its header names, and that redis
// section loads with the real config loader, naming the Sentinel services it starts.
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/shared/index.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const text = readFileSync(join(repoRoot, 'deploy/docker-compose.sentinel.yml'), 'utf8');

interface Service {
  command?: string[];
  hostname?: string;
  depends_on?: Record<string, { condition: string }>;
}

describe('deploy/docker-compose.sentinel.yml', () => {
  const compose = parse(text, { merge: true }) as { services: Record<string, Service> };

  it('starts a replica of the redis service and three Sentinels that monitor tm-primary with a quorum of two', () => {
    expect(compose.services['redis-replica']?.command).toEqual(
      expect.arrayContaining(['--replicaof', 'redis', '6379']),
    );
    for (const name of ['sentinel-1', 'sentinel-2', 'sentinel-3']) {
      const s = compose.services[name];
      expect(s?.hostname).toBe(name);
      expect(s?.command?.join(' ')).toContain('sentinel monitor tm-primary redis 6379 2');
    }
  });

  it('the redis section in its header loads and names those Sentinels', () => {
    const header = text
      .split('\n')
      .filter((l) => l.startsWith('#   '))
      .map((l) => l.slice(4))
      .join('\n');
    const section = header.slice(header.indexOf('redis:'));
    const config = loadConfig({
      text: `${section}\ndatasets: [{ name: a, prompts: a.jsonl, tokenBudget: 1 }]\n`,
      baseDir: repoRoot,
    });
    expect(config.redis.name).toBe('tm-primary');
    expect(config.redis.sentinels?.map((s) => s.split(':')[0])).toEqual(['sentinel-1', 'sentinel-2', 'sentinel-3']);
    for (const worker of ['producer', 'inference-worker', 'postprocess-worker', 'dashboard']) {
      expect(compose.services[worker]?.depends_on?.['sentinel-1']?.condition).toBe('service_healthy');
    }
  });
});
