import type { Command } from 'commander';
import {
  checkDflashMaskToken,
  configJsonSchema,
  configReferenceMarkdown,
  loadConfig,
  loadConfiguredTokenizer,
  type Config,
} from '../../shared/index.js';

interface ConfigCommandOptions {
  config?: string;
  schema?: boolean;
  reference?: boolean;
}

/** A copy of the config that is safe to print: the Redis and Sentinel passwords, the dashboard token and the SGLang API key are masked. */
export function printableConfig(config: Config): Config {
  if (config.dashboard.token !== undefined) config = { ...config, dashboard: { ...config.dashboard, token: '***' } };
  if (config.sglang.apiKey !== undefined) config = { ...config, sglang: { ...config.sglang, apiKey: '***' } };
  if (config.redis.password !== undefined) config = { ...config, redis: { ...config.redis, password: '***' } };
  if (config.redis.sentinelPassword !== undefined)
    config = { ...config, redis: { ...config.redis, sentinelPassword: '***' } };
  const url = config.redis.url;
  if (url === undefined) return config;
  let masked = url;
  try {
    const u = new URL(url);
    if (u.password !== '') {
      u.password = '***';
      masked = u.toString();
    }
  } catch {
    // Validated URLs always parse; print as it is otherwise.
  }
  return { ...config, redis: { ...config.redis, url: masked } };
}

/**
 * What can be checked of the config against its tokenizer without data: DFlash's mask token
 * (`postprocess.dflash.maskToken`). Throws the ConfigError that names what is wrong.
 */
async function checkAgainstTokenizer(config: Config): Promise<void> {
  const maskToken = config.postprocess.dflash?.maskToken;
  if (maskToken === undefined) return;
  checkDflashMaskToken(await loadConfiguredTokenizer(config), maskToken, config.source.file);
}

/** `tokenmill config -c F | --schema | --reference`: validate and print a config, or describe the format. */
export function registerConfigCommand(program: Command): void {
  program
    .command('config')
    .description(
      'validate a config file and print it resolved (defaults applied, absolute paths), or print its JSON Schema',
    )
    .option('-c, --config <file>', 'config file (YAML) to validate')
    .option('--schema', 'print the JSON Schema of the config file')
    .option('--reference', 'print the reference of every config key as a Markdown table')
    .action(async (opts: ConfigCommandOptions, cmd: Command) => {
      if (opts.schema === true) {
        process.stdout.write(`${JSON.stringify(configJsonSchema(), null, 2)}\n`);
      } else if (opts.reference === true) {
        process.stdout.write(configReferenceMarkdown());
      } else if (opts.config !== undefined) {
        // Throws ConfigError, which main() prints with every problem and exits 1.
        const config = loadConfig({ path: opts.config });
        await checkAgainstTokenizer(config);
        process.stdout.write(`${JSON.stringify(printableConfig(config), null, 2)}\n`);
      } else {
        cmd.error('tokenmill config: give -c <file> to validate a config, or --schema');
      }
    });
}
