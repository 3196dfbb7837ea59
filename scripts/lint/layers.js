// ESLint rule `layers/folder-entry`: an import that leaves its own folder may enter another folder
// only through that folder's index.ts. A file may import files of its own folder and of the
// folders above it; to reach anything below a sibling (or below its own folder), it goes through
// the index of the first folder it enters. So `src/workers/x.ts` imports `../shared/index.js`,
// never `../shared/config/config.js`, and a folder's internals stay its own (docs/design.md, Layout).
import path from 'node:path';
import { noTypeCycle } from './type-cycles.js';

/** The index a relative import from `importer` to `target` must go through, or undefined if direct is fine. */
export function requiredEntry(importer, target) {
  const importerDir = path.dirname(importer);
  const targetDir = path.dirname(target);
  let common = importerDir;
  while (!(targetDir + path.sep).startsWith(common + path.sep)) common = path.dirname(common);
  if (targetDir === common) return undefined;
  const first = path.relative(common, targetDir).split(path.sep)[0];
  const entry = path.join(common, first, 'index');
  return target.replace(/\.(js|ts)$/, '') === entry ? undefined : entry;
}

const folderEntry = {
  meta: {
    type: 'problem',
    docs: { description: 'imports enter another folder only through its index.ts' },
    schema: [],
    messages: { internal: "'{{spec}}' reaches into {{folder}}/: import it from '{{entry}}' (that folder's index.ts)" },
  },
  create(context) {
    const file = context.filename;
    const check = (node) => {
      const spec = node.source?.value;
      if (typeof spec !== 'string' || !spec.startsWith('.')) return;
      const target = path.resolve(path.dirname(file), spec);
      const entry = requiredEntry(file, target);
      if (entry === undefined) return;
      let rel = path.relative(path.dirname(file), entry) + '.js';
      if (!rel.startsWith('.')) rel = `./${rel}`;
      context.report({
        node: node.source,
        messageId: 'internal',
        data: { spec, entry: rel, folder: path.relative(process.cwd(), path.dirname(entry)) },
      });
    };
    return {
      ImportDeclaration: check,
      ExportNamedDeclaration: check,
      ExportAllDeclaration: check,
      ImportExpression: check,
    };
  },
};

export default { rules: { 'folder-entry': folderEntry, 'no-type-cycle': noTypeCycle } };
