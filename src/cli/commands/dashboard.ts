import type { Command } from 'commander';
import { AppError } from '../../shared/index.js';
import { DASHBOARD_USER, startDashboard } from '../../dashboard/index.js';
import { onceSignalled, openRunContext } from '../run-context.js';

interface DashboardCommandOptions {
  config: string;
  host?: string;
  port?: string;
}

function parsePort(text: string): number {
  const port = Number(text);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new AppError(`--port: expected a TCP port (0-65535), got "${text}"`);
  return port;
}

/**
 * `dashboard`: the pipeline page, Bull Board over the run's queues, `/api/status` and
 * `/metrics`, until SIGINT / SIGTERM. A non-loopback `--host` needs a configured token.
 */
export function registerDashboardCommand(program: Command): void {
  program
    .command('dashboard')
    .description(
      "serve the run's pipeline page (live progress, endpoints, workers, pause / resume / retry per dataset), Bull Board over its queues at /queues, its status as JSON and Prometheus metrics at /metrics, behind a token",
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--host <host>', 'address to listen on (default: dashboard.host of the config, 127.0.0.1)')
    .option('--port <port>', 'TCP port (default: dashboard.port of the config, 3000)')
    .action(async (opts: DashboardCommandOptions) => {
      const port = opts.port === undefined ? undefined : parsePort(opts.port);
      const ctx = await openRunContext(opts.config);
      try {
        const envToken = process.env['DASHBOARD_TOKEN'];
        const configured =
          ctx.config.dashboard.token ?? (envToken === undefined || envToken === '' ? undefined : envToken);
        const dashboard = await startDashboard({
          redis: ctx.redis,
          keys: ctx.keys,
          config: ctx.config,
          host: opts.host ?? ctx.config.dashboard.host,
          port: port ?? ctx.config.dashboard.port,
          ...(configured === undefined ? {} : { token: configured }),
        });
        if (configured === undefined) {
          process.stderr.write(
            `tokenmill dashboard: ${dashboard.url} (user "${DASHBOARD_USER}", generated token: ${dashboard.token}; set dashboard.token or DASHBOARD_TOKEN to keep one)\n`,
          );
        } else {
          process.stderr.write(
            `tokenmill dashboard: ${dashboard.url} (user "${DASHBOARD_USER}", password: the configured token)\n`,
          );
        }
        const signal = await onceSignalled();
        process.stderr.write(`tokenmill dashboard: ${signal}, stopping\n`);
        // HTTP server, then the queues (inside stop()), then Redis (ctx.close() below).
        await dashboard.stop();
      } finally {
        await ctx.close();
      }
    });
}
