import { formatEndpointHealth, formatEta, formatInt, readRunStatus, type RunStatus } from '../shared/index.js';
import type { RunContext } from './run-context.js';

/**
 * One progress line: datasets completed, tokens, requests in flight, tok/s, failures, the ETA
 * range and endpoint health ("endpoints 2/2 healthy"); then why nothing moves, when that is so:
 * no endpoint healthy ("waiting: 0/1 endpoints healthy (… connect ECONNREFUSED …)") or a dataset
 * stalled.
 */
export function formatProgressLine(s: RunStatus, elapsedSec: number, nowMs = Date.now(), configFile?: string): string {
  const gen = s.datasets.filter((d) => d.tokenBudget !== null);
  const done = gen.filter((d) => d.status === 'completed').length;
  const tokens = gen.reduce((a, d) => a + d.outputTokens, 0);
  const inFlight = gen.reduce((a, d) => a + d.inFlight, 0);
  const rate = gen.reduce((a, d) => a + d.tokensPerSec, 0);
  const failed = gen.reduce((a, d) => a + d.failed, 0);
  let line = `[${elapsedSec}s] generate: ${done}/${gen.length} datasets completed, ${formatInt(tokens)} tokens, ${inFlight} in flight, ${formatInt(Math.round(rate))} tok/s${failed > 0 ? `, ${failed} failed` : ''}`;
  const active = gen.filter((d) => d.status === 'in_progress' || d.status === 'pending');
  const generating = active.length > 0;
  // The run ends with its slowest dataset: the range of the latest ETAs, once every one is
  // measured ("ETA unknown" before). Paused datasets have none (they wait for `resume`).
  if (generating && active.every((d) => d.etaSeconds.low !== null)) {
    line += `, ETA ${formatEta({ low: Math.max(...active.map((d) => d.etaSeconds.low ?? 0)), high: Math.max(...active.map((d) => d.etaSeconds.high ?? d.etaSeconds.low ?? 0)) })}`;
  } else if (generating) {
    line += ', ETA unknown';
  }
  // Only what workers reported: before the first report, "no healthy endpoint" would be a guess.
  const health = formatEndpointHealth(s.endpoints);
  if (health !== null && s.endpoints.healthy > 0) line += `, endpoints ${health}`;
  else if (generating && health !== null) line += `; ${health}`;
  // A paused dataset waits for a person: say so, with the command that resumes it.
  const paused = gen.filter((d) => d.status === 'paused');
  if (paused.length > 0) {
    const c = configFile === undefined ? '<config>' : quoteArg(configFile);
    line += `; paused: ${paused.map((d) => d.name).join(', ')} (resume with ${paused.map((d) => `\`tokenmill resume -c ${c} ${quoteArg(d.name)}\``).join(', ')})`;
  }
  for (const d of gen) {
    if (d.stalled !== null)
      line += `; STALLED: ${d.name} for ${Math.round((nowMs - d.stalled.sinceMs) / 1000)}s (${d.stalled.reason}; a bug, see the log)`;
  }
  return line;
}

/** A shell word as typed: unquoted when plain, else in single quotes. */
function quoteArg(arg: string): string {
  return /^[\w./:@+-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, "'\\''")}'`;
}

/**
 * Prints one progress line to stderr every `intervalMs` while a run generates. Returns a stop
 * function.
 */
export function startProgress(ctx: RunContext, intervalMs: number): () => void {
  const started = Date.now();
  const tick = async (): Promise<void> => {
    const s = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
    process.stderr.write(
      `${formatProgressLine(s, Math.round((Date.now() - started) / 1000), Date.now(), ctx.config.source.file)}\n`,
    );
  };
  const timer = setInterval(() => {
    void tick().catch(() => undefined);
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
