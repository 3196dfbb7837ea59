// `postprocess.verifyWithPython`: before a merge swaps the merged dataset in, Python's own
// `datasets.load_from_disk` loads the staged folder in a child process, and the swap is refused
// when it fails or sees other rows or columns than tokenmill wrote. The interpreter is checked
// at the start of the merge, so a missing Python or one without `datasets` fails before any
// work, naming `postprocess.python`.
import { fileURLToPath } from 'node:url';

import { errorMessage } from '../../errors.js';
import { runCaptured, type CapturedRun } from '../../util/index.js';
import { DatasetMergeError, log, type MergeOptions, type MergeReport } from './common.js';

/** The interpreter used when `postprocess.python` is not set. */
export const DEFAULT_PYTHON = 'python3';

/** How long loading the merged dataset may take (it memory-maps every shard). */
const LOAD_TIMEOUT_MS = 30 * 60_000;
/** How long importing `datasets` may take. */
const IMPORT_TIMEOUT_MS = 2 * 60_000;

const SCRIPT = fileURLToPath(new URL('./verify_load_from_disk.py', import.meta.url));

/** What the Python side printed. */
interface PythonAnswer {
  python: string;
  datasets: string;
  num_rows?: number;
  columns?: string;
}

type RunResult = CapturedRun;

function runPython(python: string, args: readonly string[], timeoutMs: number): Promise<RunResult> {
  return runCaptured(python, [SCRIPT, ...args], {
    timeoutMs,
    env: { ...process.env, HF_DATASETS_OFFLINE: '1', PYTHONIOENCODING: 'utf-8', PYTHONDONTWRITEBYTECODE: '1' },
  });
}

/** The last non-blank line of Python's stderr (the exception), or how the process ended. */
function pythonError(r: RunResult): string {
  const last = r.stderr
    .trim()
    .split('\n')
    .filter((l) => l.trim() !== '')
    .at(-1);
  if (last !== undefined) return last.trim();
  return r.signal === null ? `exit code ${String(r.code)}` : `killed by ${r.signal}`;
}

function parseAnswer(r: RunResult): PythonAnswer | undefined {
  try {
    return JSON.parse(r.stdout) as PythonAnswer;
  } catch {
    return undefined;
  }
}

/** A checked interpreter, ready to verify merged folders. */
export interface PythonVerifier {
  python: string;
  /** `datasets.__version__` of that interpreter. */
  datasetsVersion: string;
  /**
   * Loads `dir` with `datasets.load_from_disk` and compares its row count and columns with the
   * report's; what is wrong goes into `report.problems` (and `report.ok` becomes false), so the
   * merge is refused and the target stays as it was.
   */
  check(dir: string, report: MergeReport): Promise<void>;
}

/**
 * Checks that `python` runs and imports `datasets`; throws a {@link DatasetMergeError} naming
 * the interpreter and `postprocess.python` when it does not.
 */
export async function pythonVerifier(python: string = DEFAULT_PYTHON): Promise<PythonVerifier> {
  const fix =
    'set postprocess.python to an interpreter with `datasets` installed, or turn postprocess.verifyWithPython off';
  let r: RunResult;
  try {
    r = await runPython(python, [], IMPORT_TIMEOUT_MS);
  } catch (e: unknown) {
    throw new DatasetMergeError(
      `postprocess.verifyWithPython: cannot run the Python interpreter "${python}" (postprocess.python): ${errorMessage(e)}; ${fix}`,
      { cause: e },
    );
  }
  const answer = parseAnswer(r);
  if (r.code !== 0 || answer === undefined) {
    throw new DatasetMergeError(
      `postprocess.verifyWithPython: "${python}" (postprocess.python) cannot import datasets: ${pythonError(r)}; ${fix}`,
    );
  }
  const datasetsVersion = answer.datasets;
  log().info(
    { python, pythonVersion: answer.python, datasets: datasetsVersion },
    'merged datasets will be loaded with Python before the swap',
  );
  return {
    python,
    datasetsVersion,
    async check(dir: string, report: MergeReport): Promise<void> {
      const who = `Python datasets ${datasetsVersion} (${python})`;
      const problems: string[] = [];
      let res: RunResult | undefined;
      try {
        res = await runPython(python, [dir], LOAD_TIMEOUT_MS);
      } catch (e: unknown) {
        problems.push(`${who} could not be run to load the merged dataset: ${errorMessage(e)}`);
      }
      const got = res === undefined ? undefined : parseAnswer(res);
      if (res !== undefined && (res.code !== 0 || got === undefined)) {
        problems.push(`${who} cannot load the merged dataset (datasets.load_from_disk): ${pythonError(res)}`);
      } else if (got !== undefined) {
        if (got.num_rows !== report.rows)
          problems.push(`${who} loads ${String(got.num_rows)} rows from the merged dataset, expected ${report.rows}`);
        if (got.columns !== report.columns)
          problems.push(`${who} sees the columns (${String(got.columns)}), expected (${report.columns})`);
      }
      if (problems.length > 0) {
        report.problems.push(...problems);
        report.ok = false;
      } else {
        log().info({ python, datasets: datasetsVersion, rows: got?.num_rows }, 'the merged dataset loads in Python');
      }
    },
  };
}

/**
 * The Python check of a merge (`opts.verifyWithPython`), its interpreter checked now; undefined
 * when the merge is not to be verified with Python.
 */
export async function pythonVerifierFor(
  opts: Pick<MergeOptions, 'verifyWithPython'>,
): Promise<PythonVerifier | undefined> {
  return opts.verifyWithPython === undefined ? undefined : pythonVerifier(opts.verifyWithPython.python);
}
