// Copies non-TypeScript sources (Lua scripts, the dashboard's static page) next to the compiled output.
import { cpSync } from 'node:fs';

cpSync('src/shared/lua', 'dist/shared/lua', { recursive: true });
cpSync('src/dashboard/public', 'dist/dashboard/public', { recursive: true });
