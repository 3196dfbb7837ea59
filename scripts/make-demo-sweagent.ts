/**
 * Writes the demo's agentic dataset, data/demo/B8_sweagent.jsonl: one SWE-agent trajectory per
 * issue, in OpenAI's shape (`tools`, assistant `tool_calls`, `tool` results), from the issues
 * already in the file (each record's first user message), so that running it again gives the
 * same file.
 *
 * Which tools each assistant turn calls is the simulated model's own plan for the issue
 * (`agentPlan` in src/sim/tool-calls.ts, with the simulator's default rates): the source is what
 * the model would do, so a regeneration against the simulator keeps the source's tool results
 * but where the simulator's rates make it call otherwise. The arguments, the results and the
 * final answers are written here from the issue's paths and names.
 *
 * Run from the repository root: npx tsx scripts/make-demo-sweagent.ts
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { DEFAULT_TOOL_CALL_RATES, agentPlan } from '../src/sim/index.js';

const FILE = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'data', 'demo', 'B8_sweagent.jsonl');

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'run_shell',
      description:
        'Run a bash command in the repository root and return its stdout, stderr and exit code. Commands time out after 300 seconds.',
      parameters: {
        type: 'object',
        properties: {
          command: { type: 'string', description: 'The command to run.' },
          timeout_s: { type: 'integer', description: 'Timeout in seconds, at most 300.' },
        },
        required: ['command'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'read_file',
      description: 'Show a file with line numbers, or the lines start_line..end_line of it.',
      parameters: {
        type: 'object',
        properties: {
          path: { type: 'string', description: 'Path relative to the repository root.' },
          start_line: { type: 'integer' },
          end_line: { type: 'integer' },
        },
        required: ['path'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'edit_file',
      description: 'Replace one exact, unique occurrence of old_str in a file with new_str.',
      parameters: {
        type: 'object',
        properties: {
          path: { type: 'string' },
          old_str: { type: 'string', description: 'The text to replace; must occur exactly once.' },
          new_str: { type: 'string' },
        },
        required: ['path', 'old_str', 'new_str'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'submit',
      description: 'Finish: the diff of the working tree is the answer. Give a one-paragraph summary.',
      parameters: {
        type: 'object',
        properties: { summary: { type: 'string' } },
        required: ['summary'],
      },
    },
  },
];

const SYSTEM = [
  'You are a software engineering agent working in a sandboxed checkout of a repository; its dependencies are',
  'installed and its tests run offline. Fix the issue the user gives you with the tools you have: locate the',
  'relevant code, reproduce the problem, make the smallest change that fixes it, run the tests, then submit.',
  'Nobody watches the terminal, so never run anything interactive. Call several tools at once when they do not',
  'depend on each other.',
].join(' ');

interface Lang {
  ext: string;
  test: (file: string) => string;
  comment: string;
}

const LANGS: Record<string, Lang> = {
  ts: { ext: 'ts', test: (f) => `npx vitest run ${f}`, comment: '//' },
  py: { ext: 'py', test: (f) => `python -m pytest -q ${f}`, comment: '#' },
  go: { ext: 'go', test: () => 'go test ./...', comment: '//' },
  rs: { ext: 'rs', test: () => 'cargo test -q', comment: '//' },
  java: { ext: 'java', test: () => './gradlew test -q', comment: '//' },
  rb: { ext: 'rb', test: (f) => `bundle exec rspec ${f}`, comment: '#' },
  cpp: { ext: 'cpp', test: () => 'ctest --test-dir build --output-on-failure', comment: '//' },
};

function langOf(file: string, issue: string): Lang {
  const ext = path.extname(file).slice(1);
  if (ext === 'tsx' || ext === 'mjs' || ext === 'js') return LANGS.ts as Lang;
  if (ext in LANGS) return LANGS[ext] as Lang;
  if (/\bpython|pandas|numpy|pytest\b/i.test(issue)) return LANGS.py as Lang;
  if (/\bgo test|goroutine|\.go\b/i.test(issue)) return LANGS.go as Lang;
  if (/\bcargo|crate|rust\b/i.test(issue)) return LANGS.rs as Lang;
  return LANGS.ts as Lang;
}

/** What a trajectory is written from: the issue's files and names. */
interface Issue {
  title: string;
  files: string[];
  names: string[];
  main: string;
  testFile: string;
  lang: Lang;
}

function readIssue(text: string, id: string): Issue {
  const quoted = [...text.matchAll(/`([^`\n]+)`/g)].map((m) => (m[1] as string).trim());
  const isFile = (q: string): boolean => /^[\w@.-]+(\/[\w@.*-]+)*\.[a-z]{1,5}$/.test(q) && q.includes('/');
  const files = [...new Set(quoted.filter(isFile))];
  const names = [...new Set(quoted.filter((q) => /^[A-Za-z_][\w.#]*(\(\))?$/.test(q) && !isFile(q)))].map((q) =>
    q.replace(/\(\)$/, ''),
  );
  const inIssue = /<issue>\s*([^\n]+)/.exec(text)?.[1];
  const title = (inIssue ?? text.split('\n').find((l) => l.trim() !== '') ?? id).trim().slice(0, 120);
  const code = files.filter((f) => !/test|spec|\.md$|\.json$/.test(f));
  const lang = langOf(code[0] ?? files[0] ?? '', text);
  const slug = id.replace(/\W/g, '_');
  const main = code[0] ?? `src/${slug}.${lang.ext}`;
  const stem = path.basename(main, path.extname(main));
  const testFile =
    files.find((f) => /test|spec/.test(f)) ??
    (lang.ext === 'py' ? `tests/test_${stem}.py` : `${path.dirname(main)}/${stem}.test.${lang.ext}`);
  return {
    title,
    files: files.length > 0 ? files : [main],
    names: names.length > 0 ? names : [stem],
    main,
    testFile,
    lang,
  };
}

/** A few numbered lines of `file` around `name`, as read_file shows them. */
function fileExcerpt(issue: Issue, file: string, name: string, from: number): string {
  const c = issue.lang.comment;
  const body =
    issue.lang.ext === 'py'
      ? [
          `def ${name.replace(/\W/g, '_')}(self, value, *, strict=False):`,
          `    ${c} Normalizes the input before it is compared.`,
          '    if value is None:',
          '        return None',
          '    parts = self._split(value)',
          '    if strict and not parts:',
          `        raise ValueError(f"empty ${name}: {value!r}")`,
          '    return self._join(parts)',
        ]
      : [
          `export function ${name.replace(/\W/g, '_')}(input: string, options: Options = {}): Result {`,
          `  ${c} Normalizes the input before it is compared.`,
          '  if (input.length === 0) return EMPTY;',
          '  const parts = split(input);',
          '  if (options.strict && parts.length === 0) {',
          `    throw new Error(\`empty ${name}: \${input}\`);`,
          '  }',
          '  return join(parts);',
          '}',
        ];
  return [`${file}:`, ...body.map((l, i) => `${String(from + i).padStart(4)}  ${l}`)].join('\n');
}

interface Call {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

type Message =
  | { role: 'system' | 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: Call[] }
  | { role: 'tool'; tool_call_id: string; content: string };

/** The trajectory of one issue: the model's plan, its arguments and results written for the issue. */
function trajectory(id: string, issueText: string): Message[] {
  const issue = readIssue(issueText, id);
  const plan = agentPlan(
    issueText,
    TOOLS.map((t) => t.function.name),
    DEFAULT_TOOL_CALL_RATES.parallel,
  );
  const messages: Message[] = [
    { role: 'system', content: SYSTEM },
    { role: 'user', content: issueText },
  ];
  let reads = 0;
  let runs = 0;
  let edited = false;
  let n = 0;
  const name = issue.names[0] as string;
  for (const round of plan) {
    const calls: Call[] = [];
    const results: string[] = [];
    for (const tool of round) {
      n += 1;
      let args: Record<string, unknown>;
      let result: string;
      switch (tool) {
        case 'read_file': {
          const file = issue.files[reads % issue.files.length] as string;
          const from = 20 + ((reads * 37 + n * 11) % 140);
          reads += 1;
          args = { path: file, start_line: from, end_line: from + 30 };
          result = fileExcerpt(issue, file, issue.names[reads % issue.names.length] as string, from);
          break;
        }
        case 'run_shell': {
          runs += 1;
          if (edited) {
            args = { command: issue.lang.test(issue.testFile) };
            result = `exit code 0\n${issue.testFile}: ${6 + (n % 9)} passed in ${(0.4 + (n % 7) / 10).toFixed(2)}s`;
          } else if (runs % 2 === 1) {
            args = { command: `grep -rn "${name.replace(/"/g, '\\"')}" ${path.dirname(issue.main)} | head -20` };
            result = `exit code 0\n${issue.main}:${40 + (n % 50)}:  ${name}(value, options)\n${issue.main}:${95 + (n % 30)}:  return ${name}(rest, { strict: true })`;
          } else {
            args = { command: issue.lang.test(issue.testFile), timeout_s: 120 };
            result = `exit code 1\nFAILED ${issue.testFile} - reproduces: ${issue.title}\n1 failed, ${4 + (n % 6)} passed`;
          }
          break;
        }
        case 'edit_file': {
          const py = issue.lang.ext === 'py';
          if (!edited) {
            args = {
              path: issue.main,
              old_str: py ? '    if strict and not parts:' : '  if (options.strict && parts.length === 0) {',
              new_str: py
                ? '    if not parts and (strict or value.strip()):'
                : "  if (parts.length === 0 && (options.strict || input.trim() !== '')) {",
            };
          } else {
            // Later edits add the case of the issue to its test file.
            const test = py
              ? `def test_${name.replace(/\W/g, '_').toLowerCase()}_keeps_input_${n}():\n    assert ${name.replace(/\W/g, '_')}(SAMPLE) == EXPECTED\n`
              : `it('${name} keeps the input of the issue (${n})', () => {\n  expect(${name.replace(/\W/g, '_')}(SAMPLE)).toEqual(EXPECTED);\n});\n`;
            args = {
              path: issue.testFile,
              old_str: py ? '# end of tests\n' : '// end of tests\n',
              new_str: `${test}${py ? '# end of tests\n' : '// end of tests\n'}`,
            };
          }
          edited = true;
          result = `The file ${String(args.path)} has been edited: 1 occurrence replaced (lines ${24 + (n % 60)}-${26 + (n % 60)}).`;
          break;
        }
        default: {
          args = { summary: `Fix: ${issue.title}. The change is in ${issue.main}, with a test in ${issue.testFile}.` };
          result = `Submitted. ${edited ? 2 : 1} file(s) changed, ${8 + (n % 20)} insertions(+), ${1 + (n % 5)} deletions(-).`;
        }
      }
      const call: Call = {
        id: `call_${id.replace(/\W/g, '')}_${n}`,
        type: 'function',
        function: { name: tool, arguments: JSON.stringify(args) },
      };
      calls.push(call);
      results.push(result);
    }
    const leads: Record<string, string[]> = {
      read_file: [
        `Let me look at the code around \`${name}\`.`,
        'I need to see more of the surrounding code before changing anything.',
        `Reading \`${issue.files[reads % issue.files.length] ?? issue.main}\` next.`,
      ],
      run_shell: edited
        ? ['Now I run the tests again.', 'Checking that the change holds with the test suite.']
        : [`I'll find where \`${name}\` is used and reproduce the problem.`, 'First, reproduce the failure.'],
      edit_file: [
        `The bug is in \`${issue.main}\`; I'll make the smallest change that fixes it.`,
        'Adding a test for the case in the issue.',
      ],
      submit: ['The fix is in place and the tests pass; submitting.'],
    };
    const options = leads[round[0] ?? 'submit'] ?? [''];
    const lead = options[messages.length % options.length] as string;
    messages.push({ role: 'assistant', content: lead, tool_calls: calls });
    calls.forEach((c, i) => messages.push({ role: 'tool', tool_call_id: c.id, content: results[i] as string }));
  }
  messages.push({
    role: 'assistant',
    content: [
      `Fixed: ${issue.title}`,
      '',
      `The cause was in \`${issue.main}\`: \`${name}\` treated an input it should accept as empty, so the later steps never saw it.`,
      `I changed the check so that only an input that is really empty is refused, and covered the case in \`${issue.testFile}\`.`,
      edited
        ? `\`${issue.lang.test(issue.testFile)}\` passes.`
        : 'I could not run the change against the tests here; please run them.',
    ].join('\n'),
  });
  return messages;
}

const records = readFileSync(FILE, 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '')
  .map((l) => JSON.parse(l) as { id: string; messages: { role: string; content: string }[] });
const lines = records.map((r) => {
  const issue = r.messages.find((m) => m.role === 'user')?.content;
  if (issue === undefined) throw new Error(`${r.id} has no user message`);
  return JSON.stringify({ id: r.id, tools: TOOLS, messages: trajectory(r.id, issue) });
});
writeFileSync(FILE, `${lines.join('\n')}\n`);
console.log(`${FILE}: ${lines.length} conversations`);
