// Commands that draw progress lines on stderr keep info-level JSON logs out of them by default
// (661 info lines in 60 s were mixed into `run`'s progress); `--log-level` still wins.
import { describe, expect, it } from 'vitest';
import { buildProgram } from '../../src/cli/main.js';
import { rootLogger } from '../../src/shared/index.js';

/** The root logger's level after the command's pre-action hook (the action itself fails: no config). */
async function levelAfter(args: string[]): Promise<string> {
  const program = buildProgram();
  program.configureOutput({ writeErr: () => undefined, writeOut: () => undefined });
  await program.parseAsync(['node', 'tokenmill', ...args]).catch(() => undefined);
  return rootLogger().level;
}

describe('default log level', () => {
  it('warn for run and demo, info for the others, --log-level wins', async () => {
    expect(await levelAfter(['run', '-c', '/nonexistent/tokenmill.yaml'])).toBe('warn');
    expect(await levelAfter(['status', '-c', '/nonexistent/tokenmill.yaml'])).toBe('info');
    expect(await levelAfter(['--log-level', 'info', 'run', '-c', '/nonexistent/tokenmill.yaml'])).toBe('info');
  });
});
