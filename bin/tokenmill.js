#!/usr/bin/env node
// Entry point of the `tokenmill` CLI: runs the compiled CLI (built by `npm ci` via `prepare`).
import { main } from '../dist/cli/main.js';

await main(process.argv);
