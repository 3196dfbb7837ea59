/**
 * The environment variables {@link loadConfig} reads, and what they fill in. A value in the
 * config file wins; an empty variable counts as unset. Kept apart from the schema so that the
 * one place reading `process.env` is easy to find.
 */

/** Environment variables that stand in for config keys, with the key each fills. */
export const CONFIG_ENV_VARS = {
  SGLANG_API_KEY: 'sglang.apiKey',
} as const;

/** The process environment, or a stand-in passed by tests. */
export type ConfigEnv = Readonly<Record<string, string | undefined>>;

/** Config values taken from the environment (only those set and non-empty). */
export interface ConfigEnvValues {
  sglangApiKey?: string;
}

/** Reads {@link CONFIG_ENV_VARS} from `env`. */
export function readConfigEnv(env: ConfigEnv): ConfigEnvValues {
  const apiKey = env['SGLANG_API_KEY'];
  return apiKey === undefined || apiKey === '' ? {} : { sglangApiKey: apiKey };
}

/** Problems with environment values, as `[variable, message]` pairs. */
export function configEnvProblems(values: ConfigEnvValues): Array<[keyof typeof CONFIG_ENV_VARS, string]> {
  if (values.sglangApiKey !== undefined && /[\r\n]/.test(values.sglangApiKey)) {
    return [['SGLANG_API_KEY', 'expected an API key without line breaks']];
  }
  return [];
}
