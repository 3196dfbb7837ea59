// The `layers/no-type-cycle` lint rule's graph: a cycle made only of `import type` is a cycle; an
// import of a type from a module that imports nothing back is not.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

// @ts-expect-error: a plain JS module of the lint plugin, without types
import { cycleComponents, importGraph } from '../../scripts/lint/type-cycles.js';
import { useTempDir } from '../helpers/temp.js';

const dir = useTempDir('tm-type-cycles-');

function write(rel: string, text: string): void {
  mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
  writeFileSync(path.join(dir, rel), text);
}

describe('layers/no-type-cycle', () => {
  it('finds a cycle of type-only imports, through an index too, and nothing else', () => {
    write('a.ts', "import type { B } from './b.js';\nexport type A = { b: B };\n");
    write('b.ts', "import type {\n  A,\n} from './a.js';\nexport type B = { a?: A };\n");
    write('c.ts', "import { d } from './sub/index.js';\nexport const c = d;\n");
    write('sub/index.ts', "export { d } from './d.js';\n");
    write('sub/d.ts', "import type { C } from '../e.js';\nexport const d = 1 as C;\n");
    write('e.ts', 'export type C = number;\n');
    write('f.ts', "export * from './g.js';\n");
    write('g.ts', "import type { F } from './f.js';\nexport type G = F;\nexport type F = 1;\n");
    const comps = cycleComponents(importGraph(dir)) as Map<string, Set<string>>;
    const named = new Set(
      [...comps.values()].map((c) =>
        [...c]
          .map((f) => path.relative(dir, f))
          .sort()
          .join(' '),
      ),
    );
    expect([...named].sort()).toEqual(['a.ts b.ts', 'f.ts g.ts']);
  });
});
