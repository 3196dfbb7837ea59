// sglang.apiKey: from the config file or SGLANG_API_KEY, validated, never printed or logged.
import { closeSync, openSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { printableConfig } from '../../src/cli/commands/config.js';
import { CONFIG_ENV_VARS, ConfigError, configReferenceMarkdown, loadConfig } from '../../src/shared/index.js';
import { createRootLogger } from '../../src/shared/logger.js';
import { useTempDir } from '../helpers/temp.js';

const tmp = useTempDir('tokenmill-config-key-');

const dataset = 'datasets:\n  - name: a\n    prompts: a.jsonl\n    tokenBudget: 10\n';
const load = (yaml: string, env: Record<string, string | undefined> = {}) =>
  loadConfig({ text: yaml, baseDir: tmp, file: 'tokenmill.yaml' }, { env });

function configError(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (e: unknown) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error('expected a ConfigError');
}

describe('sglang.apiKey', () => {
  it('is optional, and read from the config file', () => {
    expect(load(dataset).sglang.apiKey).toBeUndefined();
    expect(load(`sglang:\n  apiKey: sk-file\n${dataset}`).sglang.apiKey).toBe('sk-file');
  });

  it('falls back to SGLANG_API_KEY; the file wins; an empty variable is unset', () => {
    expect(CONFIG_ENV_VARS.SGLANG_API_KEY).toBe('sglang.apiKey');
    expect(load(dataset, { SGLANG_API_KEY: 'sk-env' }).sglang.apiKey).toBe('sk-env');
    expect(load(`sglang:\n  apiKey: sk-file\n${dataset}`, { SGLANG_API_KEY: 'sk-env' }).sglang.apiKey).toBe('sk-file');
    expect(load(dataset, { SGLANG_API_KEY: '' }).sglang.apiKey).toBeUndefined();
  });

  it('rejects a wrong type, an empty key and a key with a line break, naming the path and line', () => {
    const wrongType = configError(() => load(`sglang:\n  apiKey: 12345\n${dataset}`));
    expect(wrongType.issues[0]).toMatchObject({ path: 'sglang.apiKey', line: 2 });
    expect(wrongType.message).toContain('tokenmill.yaml:2: sglang.apiKey: expected an API key');
    expect(configError(() => load(`sglang:\n  apiKey: ""\n${dataset}`)).message).toContain(
      'sglang.apiKey: expected an API key, not an empty string',
    );
    expect(configError(() => load(`sglang:\n  apiKey: "a\\nb"\n${dataset}`)).message).toContain('without line breaks');
    const env = configError(() => load(dataset, { SGLANG_API_KEY: 'a\nb' }));
    expect(env.message).toContain('SGLANG_API_KEY: expected an API key without line breaks');
    expect(env.message).not.toContain('a\nb');
  });

  it('is documented in the config reference with its environment variable', () => {
    const ref = configReferenceMarkdown();
    expect(ref).toContain('sglang.apiKey');
    expect(ref).toContain('SGLANG_API_KEY');
  });

  it('is masked when the config is printed', () => {
    const c = load(`sglang:\n  apiKey: sk-secret-123\n${dataset}`);
    const printed = JSON.stringify(printableConfig(c));
    expect(printed).not.toContain('sk-secret-123');
    expect(printableConfig(c).sglang.apiKey).toBe('***');
    expect(c.sglang.apiKey).toBe('sk-secret-123');
  });

  it('is redacted from logs', () => {
    const file = join(tmp, 'log.jsonl');
    const fd = openSync(file, 'w');
    try {
      // The root logger with its own redaction settings, writing to a file the test reads.
      const log = createRootLogger({ level: 'info', destination: fd });
      const c = load(`sglang:\n  apiKey: sk-secret-456\n${dataset}`);
      log.info({ sglang: c.sglang }, 'config');
      log.info({ apiKey: 'sk-secret-456' }, 'direct');
      log.info({ options: { apiKey: 'sk-secret-456' } }, 'nested');
    } finally {
      closeSync(fd);
    }
    const out = readFileSync(file, 'utf8');
    expect(out.split('\n').filter((l) => l.includes('[redacted]'))).toHaveLength(3);
    expect(out).not.toContain('sk-secret-456');
  });
});
