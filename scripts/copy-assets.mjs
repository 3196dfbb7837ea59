// Copies non-TypeScript sources (Lua scripts, the dashboard's static page, the Python check of verifyWithPython) next to the compiled output.
import { cpSync } from 'node:fs';

cpSync('src/shared/redis/lua', 'dist/shared/redis/lua', { recursive: true });
cpSync('src/dashboard/public', 'dist/dashboard/public', { recursive: true });
cpSync('src/shared/hf-dataset/merge/verify_load_from_disk.py', 'dist/shared/hf-dataset/merge/verify_load_from_disk.py');
