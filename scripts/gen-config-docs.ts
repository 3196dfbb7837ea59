// Prints the config reference (every key: path, type, default, description), generated from the
// zod schema in src/shared/config/ (config.ts and its sections), or writes it into docs/config.md.
//
//   npx tsx scripts/gen-config-docs.ts                         # print the Markdown table
//   npx tsx scripts/gen-config-docs.ts --write docs/config.md  # FILE defaults to docs/config.md
//       # replace the text between <!-- config-reference:start --> and <!-- config-reference:end -->
//
// test/unit/docs-config-reference.test.ts fails when docs/config.md is not the current table.
import { readFileSync, writeFileSync } from 'node:fs';
import { configReferenceMarkdown } from '../src/shared/config/reference.js';

const START = '<!-- config-reference:start -->';
const END = '<!-- config-reference:end -->';
const DEFAULT_FILE = 'docs/config.md';

const table = configReferenceMarkdown();
const writeAt = process.argv.indexOf('--write');
if (writeAt === -1) {
  process.stdout.write(table);
} else {
  const file = process.argv[writeAt + 1] ?? DEFAULT_FILE;
  if (file.startsWith('-')) {
    console.error('usage: gen-config-docs.ts [--write [FILE]]   (FILE defaults to docs/config.md)');
    process.exit(2);
  }
  const text = readFileSync(file, 'utf8');
  const from = text.indexOf(START);
  const to = text.indexOf(END);
  if (from === -1 || to === -1 || to < from) {
    console.error(`${file}: markers ${START} … ${END} not found`);
    process.exit(1);
  }
  writeFileSync(file, `${text.slice(0, from + START.length)}\n\n${table}\n${text.slice(to)}`);
  console.error(`${file}: config reference updated`);
}
