import type { Command } from 'commander';
import { registerConfigCommand } from './config.js';
import { registerDashboardCommand } from './dashboard.js';
import { registerDatasetActionCommands } from './dataset-actions.js';
import { registerDemoCommand } from './demo.js';
import { registerEvalCommand } from './eval.js';
import { registerExportCommand } from './export.js';
import { registerSimCommand } from './sim.js';
import { registerGenerationCommands } from './generation.js';
import { registerPostprocessCommands } from './postprocess.js';
import { registerPrepareCommand } from './prepare.js';
import { registerShowCommand } from './show.js';
import { registerStatusCommand } from './status.js';
import { registerTrainCommand } from './train.js';

/** Adds every verb to the program. Each verb lives in its own file in this folder. */
export function registerCommands(program: Command): void {
  registerConfigCommand(program);
  registerSimCommand(program);
  registerPrepareCommand(program);
  registerGenerationCommands(program);
  registerPostprocessCommands(program);
  registerExportCommand(program);
  registerStatusCommand(program);
  registerDatasetActionCommands(program);
  registerShowCommand(program);
  registerTrainCommand(program);
  registerEvalCommand(program);
  registerDemoCommand(program);
  registerDashboardCommand(program);
}
