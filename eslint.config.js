import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';
import { createTypeScriptImportResolver } from 'eslint-import-resolver-typescript';
import layers from './scripts/lint/layers.js';

export default tseslint.config(
  {
    ignores: [
      'dist/**',
      'node_modules/**',
      '.venv/**',
      '.venv-datasets3/**',
      '.venv-trainers/**',
      'out/**',
      '.tmp/**',
      'bin/**',
      'eslint.config.js',
      'scripts/lint/**',
    ],
  },
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/consistent-type-imports': 'error',
      'no-console': 'error',
    },
  },
  // The layout (docs/design.md): no import cycles in src, and no import into another folder's
  // internals. Tests and benchmarks may reach internals; they are not part of the layers.
  {
    files: ['src/**/*.ts'],
    plugins: { 'import-x': importX, layers },
    settings: {
      ...importX.flatConfigs.typescript.settings,
      'import-x/resolver': undefined,
      'import-x/resolver-next': [createTypeScriptImportResolver({ project: 'tsconfig.json' })],
    },
    rules: {
      'import-x/no-cycle': ['error', { ignoreExternal: true }],
      'layers/folder-entry': 'error',
      'layers/no-type-cycle': 'error',
    },
  },
  { files: ['src/cli/**', 'test/**', 'bench/**', 'scripts/**'], rules: { 'no-console': 'off' } },
);
