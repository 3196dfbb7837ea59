/**
 * The Docker Compose deployment, checked without a Docker engine: docker-compose.yml is parsed
 * (YAML merge keys resolved, `${VAR:-default}` interpolated with every variable unset), and
 * every command a tokenmill container runs is checked against the real CLI program — the verb,
 * each option, option values, required options and positional arguments — so that a renamed
 * verb or option breaks this test instead of a deployment. deploy/tokenmill.yaml is loaded
 * with the real config loader and cross-checked with the compose file (host names, ports,
 * mounts).
 */
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, posix, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command, Option } from 'commander';
import { parse } from 'yaml';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { buildProgram } from '../../src/cli/main.js';
import { loadConfig, type Config } from '../../src/shared/index.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const composePath = join(repoRoot, 'docker-compose.yml');
const dockerfilePath = join(repoRoot, 'Dockerfile');
const deployConfigPath = join(repoRoot, 'deploy/tokenmill.yaml');

// ---------------------------------------------------------------------------------------------
// The parts of the Compose file format that these checks read
// ---------------------------------------------------------------------------------------------

const DependencySchema = z.looseObject({
  condition: z.enum(['service_started', 'service_healthy', 'service_completed_successfully']),
  required: z.boolean().optional(),
});

const HealthcheckSchema = z.looseObject({
  test: z.union([z.string(), z.array(z.string())]),
  interval: z.string().optional(),
  timeout: z.string().optional(),
  retries: z.number().optional(),
  start_period: z.string().optional(),
});

const DeviceSchema = z.looseObject({
  driver: z.string().optional(),
  count: z.union([z.number(), z.string()]).optional(),
  device_ids: z.array(z.string()).optional(),
  capabilities: z.array(z.string()),
});

const ServiceSchema = z.looseObject({
  image: z.string().optional(),
  build: z
    .union([
      z.string(),
      z.looseObject({
        context: z.string().optional(),
        dockerfile: z.string().optional(),
        target: z.string().optional(),
      }),
    ])
    .optional(),
  command: z.union([z.string(), z.array(z.string())]).optional(),
  entrypoint: z.union([z.string(), z.array(z.string())]).optional(),
  profiles: z.array(z.string()).optional(),
  container_name: z.string().optional(),
  ports: z.array(z.unknown()).optional(),
  volumes: z.array(z.string()).optional(),
  environment: z
    .union([z.array(z.string()), z.record(z.string(), z.union([z.string(), z.number(), z.boolean(), z.null()]))])
    .optional(),
  depends_on: z.union([z.array(z.string()), z.record(z.string(), DependencySchema)]).optional(),
  healthcheck: HealthcheckSchema.optional(),
  restart: z.string().optional(),
  pull_policy: z.string().optional(),
  stop_grace_period: z.string().optional(),
  ipc: z.string().optional(),
  shm_size: z.union([z.string(), z.number()]).optional(),
  networks: z
    .union([
      z.array(z.string()),
      z.record(z.string(), z.looseObject({ aliases: z.array(z.string()).optional() }).nullable()),
    ])
    .optional(),
  deploy: z
    .looseObject({
      replicas: z.number().optional(),
      resources: z
        .looseObject({ reservations: z.looseObject({ devices: z.array(DeviceSchema).optional() }).optional() })
        .optional(),
    })
    .optional(),
});
type Service = z.infer<typeof ServiceSchema>;

const ComposeSchema = z.looseObject({
  services: z.record(z.string(), ServiceSchema),
  volumes: z.record(z.string(), z.unknown().nullable()).optional(),
});
type Compose = z.infer<typeof ComposeSchema>;

/**
 * Compose's variable interpolation for `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
 * `${VAR:?error}`, `${VAR?error}` and `$$`, applied to every string value (not to keys).
 */
function interpolate(value: unknown, env: Readonly<Record<string, string>>): unknown {
  if (typeof value === 'string') {
    return value.replace(
      /\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-?])((?:[^}])*))?\}/g,
      (whole, name: string | undefined, colon: string, op: string, arg: string) => {
        if (whole === '$$') return '$';
        const v = env[name ?? ''];
        const missing = v === undefined || (colon === ':' && v === '');
        if (op === '-') return missing ? arg : (v ?? '');
        if (op === '?') {
          if (missing) throw new Error(`required variable ${name ?? ''} is missing: ${arg}`);
          return v ?? '';
        }
        return v ?? '';
      },
    );
  }
  if (Array.isArray(value)) return value.map((v) => interpolate(v, env));
  if (typeof value === 'object' && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, interpolate(v, env)]));
  }
  return value;
}

/** The compose file as Compose sees it with no variable set (merge keys resolved, defaults applied). */
function loadCompose(text: string, env: Readonly<Record<string, string>> = {}): Compose {
  return ComposeSchema.parse(interpolate(parse(text, { merge: true }), env));
}

/** The service's command as an argv. Compose splits a string command like a shell does; ours have no quotes. */
function argv(command: string | string[] | undefined): string[] {
  if (command === undefined) return [];
  return Array.isArray(command) ? command : command.trim().split(/\s+/);
}

interface Dependency {
  condition: string;
  required: boolean;
}

function dependencies(service: Service): Map<string, Dependency> {
  const deps = service.depends_on;
  if (deps === undefined) return new Map();
  if (Array.isArray(deps)) return new Map(deps.map((d) => [d, { condition: 'service_started', required: true }]));
  return new Map(
    Object.entries(deps).map(([name, d]) => [name, { condition: d.condition, required: d.required ?? true }]),
  );
}

function environment(service: Service): Record<string, string> {
  const env = service.environment;
  if (env === undefined) return {};
  if (Array.isArray(env)) {
    return Object.fromEntries(
      env.map((e) => [e.split('=')[0] ?? e, e.includes('=') ? e.slice(e.indexOf('=') + 1) : '']),
    );
  }
  return Object.fromEntries(Object.entries(env).map(([k, v]) => [k, v === null ? '' : String(v)]));
}

interface Mount {
  source: string;
  target: string;
  readOnly: boolean;
  /** A named volume (declared under top-level `volumes:`), not a host path. */
  named: boolean;
}

/** Short-syntax volume entries: `source:target[:mode]`. */
function mounts(service: Service): Mount[] {
  return (service.volumes ?? []).map((v) => {
    const [source = '', target = '', mode = ''] = v.split(':');
    const named = !/^[./~]/.test(source) && !source.startsWith('$');
    return { source, target, readOnly: mode.split(',').includes('ro'), named };
  });
}

function gpuDevices(service: Service): z.infer<typeof DeviceSchema>[] {
  return (service.deploy?.resources?.reservations?.devices ?? []).filter(
    (d) =>
      d.driver === 'nvidia' && d.capabilities.includes('gpu') && (d.count !== undefined || d.device_ids !== undefined),
  );
}

function healthcheckText(service: Service): string {
  const test = service.healthcheck?.test;
  return Array.isArray(test) ? test.join(' ') : (test ?? '');
}

/** Compose durations as used here: `1h2m3s`, `45s`, `20m`, `500ms`. */
function durationMs(text: string): number {
  const units: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1000, ms: 1, us: 0.001 };
  let total = 0;
  const rest = text.replace(/(\d+(?:\.\d+)?)(ms|us|h|m|s)/g, (_w, n: string, u: string) => {
    total += Number(n) * (units[u] ?? Number.NaN);
    return '';
  });
  if (rest !== '' || Number.isNaN(total)) throw new Error(`not a duration: "${text}"`);
  return total;
}

/** Services built from this repository's Dockerfile: the ones that run `tokenmill`. */
function tokenmillServices(compose: Compose): [string, Service][] {
  return Object.entries(compose.services).filter(([, s]) => s.build !== undefined);
}

const isDefault = (service: Service): boolean => (service.profiles ?? []).length === 0;

// ---------------------------------------------------------------------------------------------
// Checks: each returns the problems it finds, so that a test can also show it catches one
// ---------------------------------------------------------------------------------------------

function findVerb(program: Command, verb: string): Command | undefined {
  return program.commands.find((c) => c.name() === verb || c.aliases().includes(verb));
}

function optionFor(options: readonly Option[], flag: string): Option | undefined {
  return options.find((o) => o.long === flag || o.short === flag);
}

/**
 * Checks one argv (after the entrypoint) against the program as commander would parse it:
 * global options, a known verb, each option declared by the verb (or the program), option
 * values accepted by the option's own parser (choices, numbers), required options present,
 * and the number of positional arguments. A verb the CLI does not have yet is reported
 * separately, as `missingVerb`.
 */
function checkArgv(program: Command, args: readonly string[]): { problems: string[]; missingVerb?: string } {
  const problems: string[] = [];
  const globals = program.options;
  let i = 0;
  // Program options before the verb (e.g. --log-level debug).
  while (i < args.length && (args[i] ?? '').startsWith('-')) {
    const flag = (args[i] ?? '').split('=')[0] ?? '';
    const opt = optionFor(globals, flag);
    if (opt === undefined) return { problems: [`unknown program option ${flag}`] };
    i += opt.required && !(args[i] ?? '').includes('=') ? 2 : 1;
  }
  const verb = args[i];
  if (verb === undefined) return { problems: ['no verb'] };
  const cmd = findVerb(program, verb);
  if (cmd === undefined) return { problems, missingVerb: verb };

  const options = [...cmd.options, ...globals];
  const seen = new Set<Option>();
  const positionals: string[] = [];
  for (i += 1; i < args.length; i++) {
    const arg = args[i] ?? '';
    if (arg === '--') {
      positionals.push(...args.slice(i + 1));
      break;
    }
    if (!arg.startsWith('-') || arg === '-') {
      positionals.push(arg);
      continue;
    }
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1;
    const flag = eq === -1 ? arg : arg.slice(0, eq);
    const opt = optionFor(options, flag);
    if (opt === undefined) {
      problems.push(
        `${verb}: unknown option ${flag} (declared: ${cmd.options.map((o) => o.long ?? o.short).join(', ')})`,
      );
      continue;
    }
    seen.add(opt);
    let value: string | undefined;
    if (eq !== -1) value = arg.slice(eq + 1);
    else if (opt.required) value = args[++i];
    else if (opt.optional && args[i + 1] !== undefined && !(args[i + 1] ?? '').startsWith('-')) value = args[++i];
    if (opt.required && value === undefined) {
      problems.push(`${verb}: option ${flag} needs a value`);
    } else if (value !== undefined && !opt.required && !opt.optional) {
      problems.push(`${verb}: option ${flag} takes no value, got "${value}"`);
    } else if (value !== undefined && opt.parseArg !== undefined) {
      try {
        opt.parseArg(value, undefined);
      } catch (e: unknown) {
        problems.push(`${verb}: option ${flag} rejects "${value}": ${e instanceof Error ? e.message : String(e)}`);
      }
    }
  }
  for (const opt of cmd.options) {
    if (opt.mandatory && !seen.has(opt) && opt.defaultValue === undefined) {
      problems.push(`${verb}: required option ${opt.long ?? opt.short ?? opt.flags} is missing`);
    }
  }
  const declared = cmd.registeredArguments;
  const needed = declared.filter((a) => a.required).length;
  const variadic = declared.some((a) => a.variadic);
  if (positionals.length < needed) problems.push(`${verb}: expects ${needed} argument(s), got ${positionals.length}`);
  if (!variadic && positionals.length > declared.length) {
    problems.push(`${verb}: unexpected argument(s) ${positionals.slice(declared.length).join(' ')}`);
  }
  return { problems };
}

/**
 * Every tokenmill service's command against the real CLI. A verb the CLI does not have yet is
 * allowed only in a service under a profile, so that `docker compose up` (no profile) never
 * starts a command that fails.
 */
function checkCommands(compose: Compose, program: Command): string[] {
  const problems: string[] = [];
  for (const [name, service] of tokenmillServices(compose)) {
    if (!Array.isArray(service.command)) {
      problems.push(`${name}: command must be a list (exec form), got ${JSON.stringify(service.command)}`);
      continue;
    }
    const result = checkArgv(program, service.command);
    problems.push(...result.problems.map((p) => `${name}: ${p}`));
    if (result.missingVerb !== undefined && isDefault(service)) {
      problems.push(`${name}: the CLI has no verb "${result.missingVerb}", and the service starts without a profile`);
    }
  }
  return problems;
}

/**
 * Dependencies as Compose resolves them: each one exists; a required one is enabled whenever
 * the dependent service is (else Compose rejects the project: "depends on undefined service");
 * `service_healthy` waits on a service that has a healthcheck.
 */
function checkDependencies(compose: Compose): string[] {
  const problems: string[] = [];
  for (const [name, service] of Object.entries(compose.services)) {
    for (const [depName, dep] of dependencies(service)) {
      const target = compose.services[depName];
      if (target === undefined) {
        problems.push(`${name}: depends on undefined service ${depName}`);
        continue;
      }
      const mine = service.profiles ?? [];
      const theirs = target.profiles ?? [];
      const alwaysEnabledWithMe = theirs.length === 0 || (mine.length > 0 && mine.every((p) => theirs.includes(p)));
      if (dep.required && !alwaysEnabledWithMe) {
        problems.push(
          `${name}: requires ${depName}, which is under profile(s) ${theirs.join(', ')} (mark it required: false)`,
        );
      }
      if (dep.condition === 'service_healthy' && target.healthcheck === undefined) {
        problems.push(`${name}: waits for ${depName} to be healthy, but ${depName} has no healthcheck`);
      }
    }
  }
  return problems;
}

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

const composeText = readFileSync(composePath, 'utf8');
const compose = loadCompose(composeText);
const program = buildProgram();

function service(name: string): Service {
  const s = compose.services[name];
  if (s === undefined) throw new Error(`docker-compose.yml has no service "${name}"`);
  return s;
}

/** A copy of the compose text with one edit; fails when the edit does not apply. */
function edited(from: string, to: string): Compose {
  expect(composeText).toContain(from);
  return loadCompose(composeText.replace(from, to));
}

/** The image the Dockerfile's stages build, by stage name. */
function dockerfileStages(text: string): Map<string, string> {
  const stages = new Map<string, string>();
  for (const m of text.matchAll(/^FROM\s+(?:--\S+\s+)*(\S+)\s+AS\s+(\S+)\s*$/gim)) {
    stages.set((m[2] ?? '').toLowerCase(), m[1] ?? '');
  }
  return stages;
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

describe('docker-compose.yml', () => {
  it('declares the planned services, each with its profile', () => {
    const profiles = Object.fromEntries(Object.entries(compose.services).map(([n, s]) => [n, s.profiles ?? []]));
    expect(profiles).toEqual({
      redis: [],
      sglang: [],
      'sglang-sim': ['sim'],
      producer: [],
      'inference-worker': [],
      'postprocess-worker': [],
      'train-worker': ['train'],
      dashboard: [],
    });
  });

  it('runs Redis 7 with AOF (fsync every second), noeviction, a data volume and a PING healthcheck', () => {
    const redis = service('redis');
    expect(redis.image).toMatch(/^redis:7(\.|-|$)/);
    const args = argv(redis.command);
    expect(args[0]).toBe('redis-server');
    const flag = (name: string): string | undefined => args[args.indexOf(name) + 1];
    expect(args).toContain('--appendonly');
    expect(flag('--appendonly')).toBe('yes');
    expect(flag('--appendfsync')).toBe('everysec');
    expect(flag('--maxmemory-policy')).toBe('noeviction');
    const data = mounts(redis).find((m) => m.target === '/data');
    expect(data?.named).toBe(true);
    expect(Object.keys(compose.volumes ?? {})).toContain(data?.source);
    expect(healthcheckText(redis)).toMatch(/redis-cli\s+ping/);
  });

  it('runs the real SGLang image on every GPU, with metrics, a local model and a /health check that allows minutes of loading', () => {
    const sglang = service('sglang');
    expect(sglang.image).toMatch(/^lmsysorg\/sglang:v\d+\.\d+\.\d+/);
    expect(sglang.pull_policy).toBe('missing');
    expect(loadCompose(composeText, { SGLANG_PULL_POLICY: 'never' }).services.sglang?.pull_policy).toBe('never');
    const args = argv(sglang.command);
    expect(args.slice(0, 3)).toEqual(['python3', '-m', 'sglang.launch_server']);
    const flag = (name: string): string | undefined => args[args.indexOf(name) + 1];
    expect(flag('--model-path')).toMatch(/^\/models\/[^/]+/);
    expect(flag('--host')).toBe('0.0.0.0');
    expect(flag('--port')).toBe('30000');
    expect(args).toContain('--enable-metrics');
    expect(environment(sglang).HF_HUB_OFFLINE).toBe('1');
    expect(mounts(sglang).some((m) => m.target === '/models' && m.readOnly)).toBe(true);
    expect(gpuDevices(sglang)).toHaveLength(1);
    expect(gpuDevices(sglang)[0]?.count).toBe('all');
    expect(sglang.ipc).toBe('host');
    expect(sglang.shm_size).toBeDefined();
    expect(healthcheckText(sglang)).toMatch(/curl .*http:\/\/(127\.0\.0\.1|localhost):30000\/health\b/);
    expect(durationMs(sglang.healthcheck?.start_period ?? '0s')).toBeGreaterThanOrEqual(10 * 60_000);
  });

  it('offers the simulator under the `sim` profile, on the port and host name of SGLang', () => {
    const sim = service('sglang-sim');
    expect(sim.image).toBe(service('producer').image);
    const args = argv(sim.command);
    expect(args[0]).toBe('sim');
    expect(args[args.indexOf('--port') + 1]).toBe('30000');
    expect(args[args.indexOf('--host') + 1]).toBe('0.0.0.0');
    const networks = sim.networks;
    expect(networks !== undefined && !Array.isArray(networks) ? networks.default?.aliases : undefined).toContain(
      'sglang',
    );
    expect(healthcheckText(sim)).toContain('http://127.0.0.1:30000/health');
    expect(gpuDevices(sim)).toHaveLength(0);
  });

  it('builds every tokenmill service from a stage of the Dockerfile, one image per stage', () => {
    const stages = dockerfileStages(readFileSync(dockerfilePath, 'utf8'));
    const imageOfTarget = new Map<string, string>();
    for (const [name, s] of tokenmillServices(compose)) {
      const build = typeof s.build === 'string' ? { context: s.build } : (s.build ?? {});
      expect(resolve(repoRoot, build.context ?? '.'), name).toBe(repoRoot);
      expect(build.dockerfile ?? 'Dockerfile', name).toBe('Dockerfile');
      const target = build.target ?? '';
      expect(stages.has(target), `${name}: Dockerfile has no stage "${target}"`).toBe(true);
      expect(s.image, `${name} names the image it builds`).toBeDefined();
      const image = imageOfTarget.get(target) ?? s.image ?? '';
      imageOfTarget.set(target, image);
      expect(s.image, `${name}: services of one build target share one image`).toBe(image);
    }
    expect([...imageOfTarget.keys()].sort()).toEqual(['runtime', 'train']);
    expect(new Set(imageOfTarget.values()).size).toBe(2);
  });

  it('runs only verbs and options the CLI declares (verbs that do not exist yet only under a profile)', () => {
    expect(checkCommands(compose, program)).toEqual([]);
    // Those the current CLI lacks are the ones kept under a profile.
    const missing = tokenmillServices(compose)
      .filter(([, s]) => Array.isArray(s.command) && checkArgv(program, s.command).missingVerb !== undefined)
      .map(([n]) => n);
    for (const name of missing) expect(service(name).profiles, name).not.toEqual([]);
  });

  it('catches a misspelled verb, an unknown option, a bad option value and a missing required option', () => {
    const typoVerb = edited(
      'command: [worker, -c, /config/tokenmill.yaml, --role, inference]',
      'command: [wroker, -c, /config/tokenmill.yaml, --role, inference]',
    );
    expect(checkCommands(typoVerb, program)).toEqual([
      'inference-worker: the CLI has no verb "wroker", and the service starts without a profile',
    ]);
    const typoOption = edited('--role, inference]', '--rol, inference]');
    expect(checkCommands(typoOption, program).join('\n')).toMatch(/inference-worker: worker: unknown option --rol\b/);
    const badValue = edited('command: [sim, --port, "30000"', 'command: [sim, --port, "thirty"');
    expect(checkCommands(badValue, program).join('\n')).toMatch(/sglang-sim: sim: option --port rejects "thirty"/);
    const noConfig = edited('command: [produce, -c, /config/tokenmill.yaml]', 'command: [produce]');
    expect(checkCommands(noConfig, program)).toEqual(['producer: produce: required option --config is missing']);
    const extraArg = edited(
      'command: [produce, -c, /config/tokenmill.yaml]',
      'command: [produce, -c, /config/tokenmill.yaml, B1_glaive]',
    );
    expect(checkCommands(extraArg, program)).toEqual(['producer: produce: unexpected argument(s) B1_glaive']);
  });

  it('waits for healthy Redis and SGLang, and never requires a service that a profile can leave out', () => {
    expect(checkDependencies(compose)).toEqual([]);
    for (const [name, s] of tokenmillServices(compose)) {
      if (name === 'sglang-sim') continue;
      expect(dependencies(s).get('redis'), name).toEqual({ condition: 'service_healthy', required: true });
    }
    for (const name of ['producer', 'inference-worker']) {
      const deps = dependencies(service(name));
      expect(deps.get('sglang'), name).toEqual({ condition: 'service_healthy', required: true });
      expect(deps.get('sglang-sim'), name).toEqual({ condition: 'service_healthy', required: false });
    }
    // The check itself: a required dependency on the simulator breaks the default project.
    const broken = loadCompose(composeText.replaceAll('required: false', 'required: true'));
    expect(checkDependencies(broken)).toContain(
      'inference-worker: requires sglang-sim, which is under profile(s) sim (mark it required: false)',
    );
  });

  it('lets inference workers scale: no container name, no host port, restarted unless stopped', () => {
    const worker = service('inference-worker');
    expect(worker.container_name).toBeUndefined();
    expect(worker.ports ?? []).toEqual([]);
    expect(worker.deploy?.replicas).toBeUndefined();
    expect(worker.restart).toBe('unless-stopped');
    // The producer exits 0 when every dataset is done: restart it only after a failure.
    expect(service('producer').restart).toBe('on-failure');
    for (const [name, s] of Object.entries(compose.services)) expect(s.restart, name).toBeDefined();
  });

  it('mounts the config read-only where the commands read it, and shares the output volume', () => {
    for (const [name, s] of tokenmillServices(compose)) {
      const args = argv(s.command);
      const configArg = args.indexOf('-c') === -1 ? undefined : args[args.indexOf('-c') + 1];
      if (configArg === undefined) continue; // sim takes no config
      const configMount = mounts(s).find((m) => m.target === configArg);
      expect(configMount?.readOnly, `${name} mounts ${configArg} read-only`).toBe(true);
      expect(resolve(repoRoot, configMount?.source ?? ''), name).toBe(deployConfigPath);
    }
    for (const name of ['producer', 'postprocess-worker', 'train-worker']) {
      const out = mounts(service(name)).find((m) => m.target === '/data/out');
      expect(out, name).toMatchObject({ source: 'tokenmill-out', named: true, readOnly: false });
    }
    expect(Object.keys(compose.volumes ?? {})).toContain('tokenmill-out');
  });

  it('gives the GPU train worker every GPU, and the dashboard a port and an auth token variable', () => {
    const train = service('train-worker');
    expect(gpuDevices(train)).toHaveLength(1);
    expect(train.build !== undefined && typeof train.build !== 'string' ? train.build.target : undefined).toBe('train');
    expect(argv(train.command)).toEqual(['worker', '-c', '/config/tokenmill.yaml', '--role', 'train', '--gpus', 'all']);
    expect(argv(loadCompose(composeText, { TRAIN_GPUS: '4,5' }).services['train-worker']?.command).slice(-2)).toEqual([
      '--gpus',
      '4,5',
    ]);
    const dashboard = service('dashboard');
    expect(Object.keys(environment(dashboard))).toContain('DASHBOARD_TOKEN');
    expect(dashboard.ports).toEqual(['127.0.0.1:3000:3000']);
    // Only the dashboard publishes a port.
    for (const [name, s] of Object.entries(compose.services)) {
      if (name !== 'dashboard') expect(s.ports ?? [], name).toEqual([]);
    }
  });

  it('gives each tokenmill container longer to stop than workers.shutdownGraceMs', () => {
    const config = loadConfig({ path: deployConfigPath });
    for (const [name, s] of tokenmillServices(compose)) {
      expect(durationMs(s.stop_grace_period ?? '10s'), name).toBeGreaterThan(config.workers.shutdownGraceMs);
    }
  });
});

describe('deploy/tokenmill.yaml', () => {
  const config: Config = loadConfig({ path: deployConfigPath });
  const producer = service('producer');

  it('passes the config loader', () => {
    expect(config.datasets.length).toBeGreaterThan(0);
  });

  it('points at the compose Redis and at SGLang by service name and port', () => {
    const redisUrl = new URL(config.redis.url ?? '');
    expect(redisUrl.hostname).toBe('redis');
    expect(redisUrl.port === '' ? '6379' : redisUrl.port).toBe('6379');
    const sglangArgs = argv(service('sglang').command);
    const sglangPort = sglangArgs[sglangArgs.indexOf('--port') + 1];
    for (const endpoint of config.sglang.endpoints) {
      const u = new URL(endpoint);
      expect(u.hostname).toBe('sglang');
      expect(u.port).toBe(sglangPort);
    }
  });

  it('reads prompts from a mount of the producer whose default host folder has every file', () => {
    for (const d of config.datasets) {
      const file = d.prompts ?? d.conversations ?? '';
      const mount = mounts(producer).find((m) => file.startsWith(`${m.target}/`));
      expect(mount, `${d.name}: ${file} is under a mount of the producer`).toBeDefined();
      expect(mount?.readOnly).toBe(true);
      const onHost = resolve(repoRoot, mount?.source ?? '', posix.relative(mount?.target ?? '', file));
      expect(existsSync(onHost), `${d.name}: ${onHost}`).toBe(true);
    }
  });

  it('writes output and the training dataset into the shared volume', () => {
    const out = mounts(producer).find((m) => m.target === '/data/out');
    expect(out?.named).toBe(true);
    expect(config.output.dir.startsWith('/data/out')).toBe(true);
    expect(config.postprocess.target.startsWith('/data/out/')).toBe(true);
  });
});

describe('Dockerfile', () => {
  const text = readFileSync(dockerfilePath, 'utf8');

  it('builds on Node.js 20 with npm ci and the build script, and runs the CLI entry point', () => {
    expect(text).toMatch(/^ARG NODE_IMAGE=node:20-slim$/m);
    expect(text).toMatch(/\bnpm ci\b/);
    expect(text).toMatch(/\bnpm run build\b/);
    const pkg = z
      .looseObject({ bin: z.record(z.string(), z.string()), scripts: z.record(z.string(), z.string()) })
      .parse(JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')));
    expect(pkg.scripts.build).toBeDefined();
    const entrypoint = /^ENTRYPOINT\s+(\[.*\])\s*$/m.exec(text)?.[1];
    expect(JSON.parse(entrypoint ?? '[]')).toEqual(['node', `/app/${pkg.bin.tokenmill ?? ''}`]);
    expect(existsSync(join(repoRoot, pkg.bin.tokenmill ?? ''))).toBe(true);
  });

  it('copies from the build context only paths the .dockerignore keeps', () => {
    const ignored = readFileSync(join(repoRoot, '.dockerignore'), 'utf8')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l !== '' && !l.startsWith('#'));
    const sources = [...text.matchAll(/^COPY\s+(?!--from)(.+)\s+\S+\s*$/gm)].flatMap((m) => (m[1] ?? '').split(/\s+/));
    expect(sources.length).toBeGreaterThan(0);
    for (const src of sources) {
      const top = src.replace(/\[s\]$/, 's').split('/')[0] ?? '';
      expect(ignored, `${src} is ignored by .dockerignore`).not.toContain(top);
    }
  });
});
