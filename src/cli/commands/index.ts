import type { Command } from 'commander';

/** Adds every verb to the program. Each verb lives in its own file in this folder. */
export function registerCommands(program: Command): void {
  void program;
}
