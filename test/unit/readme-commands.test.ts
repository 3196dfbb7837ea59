// The README's CLI table names every verb the program registers (src/cli/commands/index.ts), and
// every option each row shows exists on its verb: a verb added or renamed without its row fails.
import { readFileSync } from 'node:fs';

import { Command } from 'commander';
import { describe, expect, it } from 'vitest';

import { registerCommands } from '../../src/cli/commands/index.js';

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const table = readme.slice(readme.indexOf('## CLI'), readme.indexOf('## Documentation'));
/** The verbs each row's first cell names: `tokenmill pause\|resume …` names two. */
const rowVerbs = [...table.matchAll(/^\| `tokenmill ([a-z-]+(?:\\\|[a-z-]+)*)/gm)].flatMap((m) =>
  (m[1] as string).split('\\|'),
);

describe('README CLI table', () => {
  it('names every verb the program registers, and no other', () => {
    const program = new Command();
    registerCommands(program);
    const verbs = program.commands.map((c) => c.name());
    expect(verbs.length).toBeGreaterThan(10);
    expect([...new Set(rowVerbs)].sort()).toEqual([...verbs].sort());
  });

  it('shows only options its verb has', () => {
    const program = new Command();
    registerCommands(program);
    for (const row of table.split('\n').filter((l) => l.startsWith('| `tokenmill '))) {
      const cell = (/^\| `([^`]+)`/.exec(row)?.[1] ?? '').replace(/\\\|/g, '|');
      const verb = cell.split(' ')[1]?.split('|')[0] ?? '';
      const cmd = program.commands.find((c) => c.name() === verb);
      expect(cmd, cell).toBeDefined();
      const longs = new Set(cmd?.options.map((o) => o.long));
      for (const flag of cell.match(/--[a-z-]+/g) ?? []) expect(longs.has(flag), `${cell}: ${flag}`).toBe(true);
    }
  });
});
