// Copies non-TypeScript sources (Lua scripts) next to the compiled output.
import { cpSync } from 'node:fs';

cpSync('src/shared/lua', 'dist/shared/lua', { recursive: true });
