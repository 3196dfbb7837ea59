// ESLint rule `layers/no-type-cycle`: no import cycle in src/, type-only imports included.
// `import-x/no-cycle` skips `import type` (it cannot cost anything at run time), but a cycle of
// types still ties two modules' designs together: neither can be understood, moved or split
// without the other. The graph is read once per lint run from the files' import and export
// declarations (relative specifiers only), and its strongly connected components found; a file in
// a component of two or more files (or importing itself) is reported on its first import into it.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';

const SPECIFIER = /(?:^|[;\n}])\s*(?:import|export)\s+(?:type\s+)?(?:[^'";]*?\s+from\s+)?['"](\.{1,2}\/[^'"]+)['"]/g;

/** `./x.js` from `dir`: the `.ts` file it names, or undefined outside the source tree. */
function resolveSpec(dir, spec) {
  const base = path.resolve(dir, spec).replace(/\.js$/, '');
  for (const candidate of [`${base}.ts`, path.join(base, 'index.ts')]) {
    try {
      if (statSync(candidate).isFile()) return candidate;
    } catch {
      // not this one
    }
  }
  return undefined;
}

function listTs(dir, out = []) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) listTs(p, out);
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

/** Each file's imports (resolved paths), every import and export declaration counted. */
export function importGraph(root) {
  const graph = new Map();
  for (const file of listTs(root)) {
    const text = readFileSync(file, 'utf8');
    const targets = [];
    for (const m of text.matchAll(SPECIFIER)) {
      const target = resolveSpec(path.dirname(file), m[1]);
      if (target !== undefined) targets.push(target);
    }
    graph.set(file, targets);
  }
  return graph;
}

/** The component (a set of files) of each file in a cycle (Tarjan's algorithm). */
export function cycleComponents(graph) {
  let index = 0;
  const indexOf = new Map();
  const low = new Map();
  const stack = [];
  const onStack = new Set();
  const out = new Map();
  const visit = (v) => {
    indexOf.set(v, index);
    low.set(v, index);
    index += 1;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!indexOf.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v), indexOf.get(w)));
      }
    }
    if (low.get(v) === indexOf.get(v)) {
      const comp = new Set();
      let w;
      do {
        w = stack.pop();
        onStack.delete(w);
        comp.add(w);
      } while (w !== v);
      if (comp.size > 1 || (graph.get(v) ?? []).includes(v)) for (const f of comp) out.set(f, comp);
    }
  };
  for (const v of graph.keys()) if (!indexOf.has(v)) visit(v);
  return out;
}

const cache = new Map();

function componentsUnder(root) {
  let c = cache.get(root);
  if (c === undefined) {
    c = cycleComponents(importGraph(root));
    cache.set(root, c);
  }
  return c;
}

export const noTypeCycle = {
  meta: {
    type: 'problem',
    docs: { description: 'no import cycle, type-only imports included' },
    schema: [],
    messages: { cycle: "'{{spec}}' closes an import cycle (type-only imports counted): {{files}}" },
  },
  create(context) {
    const file = context.filename;
    const root = path.join(context.cwd ?? process.cwd(), 'src');
    if (!file.startsWith(root + path.sep)) return {};
    const comp = componentsUnder(root).get(file);
    if (comp === undefined) return {};
    let reported = false;
    const check = (node) => {
      const spec = node.source?.value;
      if (reported || typeof spec !== 'string' || !spec.startsWith('.')) return;
      const target = resolveSpec(path.dirname(file), spec);
      if (target === undefined || !comp.has(target)) return;
      reported = true;
      context.report({
        node: node.source,
        messageId: 'cycle',
        data: {
          spec,
          files: [...comp]
            .map((f) => path.relative(root, f))
            .sort()
            .join(' ↔ '),
        },
      });
    };
    return { ImportDeclaration: check, ExportNamedDeclaration: check, ExportAllDeclaration: check };
  },
};
