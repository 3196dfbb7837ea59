import type { Command } from 'commander';
import { registerConfigCommand } from './config.js';

/** Adds every verb to the program. Each verb lives in its own file in this folder. */
export function registerCommands(program: Command): void {
  registerConfigCommand(program);
  void program;
}
