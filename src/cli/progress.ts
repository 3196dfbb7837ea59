import { readRunStatus } from '../shared/index.js';
import type { RunContext } from './run-context.js';

/**
 * Prints one progress line to stderr every `intervalMs` while a run generates: datasets
 * completed, tokens against the budgets, requests in flight, tok/s. Returns a stop function.
 */
export function startProgress(ctx: RunContext, intervalMs: number): () => void {
  const started = Date.now();
  const tick = async (): Promise<void> => {
    const s = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
    const gen = s.datasets.filter((d) => d.tokenBudget !== null);
    const done = gen.filter((d) => d.status === 'completed').length;
    const tokens = gen.reduce((a, d) => a + d.outputTokens, 0);
    const inFlight = gen.reduce((a, d) => a + d.inFlight, 0);
    const rate = gen.reduce((a, d) => a + d.tokensPerSec, 0);
    const failed = gen.reduce((a, d) => a + d.failed, 0);
    const secs = Math.round((Date.now() - started) / 1000);
    process.stderr.write(
      `[${secs}s] generate: ${done}/${gen.length} datasets completed, ${tokens.toLocaleString('en-US')} tokens, ${inFlight} in flight, ${Math.round(rate).toLocaleString('en-US')} tok/s${failed > 0 ? `, ${failed} failed` : ''}\n`,
    );
  };
  const timer = setInterval(() => {
    void tick().catch(() => undefined);
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
