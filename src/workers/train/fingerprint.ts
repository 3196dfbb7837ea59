import { errorMessage, runCaptured, type CapturedRun } from '../../shared/index.js';
import { basename } from 'node:path';
import type { GpuInfo } from '../gpu/index.js';

/** The trainer environment recorded before a training starts. */
export interface EnvFingerprint {
  /** Interpreter probed, and its version (null when it could not run). */
  pythonPath: string;
  python: string | null;
  /** CUDA version torch was built with (`torch.version.cuda`); null without torch or CUDA. */
  cuda: string | null;
  /** NVIDIA driver (from nvidia-smi); null without a GPU. */
  driver: string | null;
  /** Names of the GPUs assigned, in order. */
  gpus: string[];
  /** Versions of the packages that matter, those installed. */
  packages: Record<string, string>;
  /** Set when the interpreter could not be probed. */
  problem?: string;
}

/** Distributions whose versions are recorded when installed. */
export const FINGERPRINT_PACKAGES = [
  'torch',
  'transformers',
  'datasets',
  'accelerate',
  'deepspeed',
  'flash-attn',
  'flash_attn',
  'sglang',
  'specforge',
  'speculators',
  'triton',
  'numpy',
  'pyarrow',
] as const;

// Reads versions from package metadata, and torch's CUDA version from torch/version.py, without
// importing anything (importing torch takes seconds).
const PROBE = `
import json, os, re, sys
from importlib import metadata, util
out = {"python": sys.version.split()[0], "packages": {}, "cuda": None}
for name in sys.argv[1:]:
    try:
        out["packages"][name.replace("_", "-")] = metadata.version(name)
    except Exception:
        pass
if "torch" in out["packages"]:
    try:
        spec = util.find_spec("torch")
        for d in spec.submodule_search_locations or []:
            p = os.path.join(d, "version.py")
            if os.path.exists(p):
                m = re.search(r"^cuda\\b[^=]*=\\s*(\\S+)", open(p).read(), re.M)
                v = m.group(1).strip(chr(39) + chr(34)) if m else "None"
                out["cuda"] = None if v == "None" else v
    except Exception as e:
        out["torch_error"] = str(e)[:200]
print(json.dumps(out))
`;

/** The interpreter to fingerprint: `train.python`, else the command's own Python, else python3. */
export function pythonOf(command: readonly string[], python?: string): string {
  if (python !== undefined) return python;
  const first = command[0] ?? '';
  return /^python(\d+(\.\d+)*)?$/.test(basename(first)) ? first : 'python3';
}

async function runProbe(
  python: string,
  cwd: string,
  timeoutMs: number,
): Promise<
  | { ok: true; value: { python: string; packages: Record<string, string>; cuda: string | null } }
  | { ok: false; problem: string }
> {
  let run: CapturedRun;
  try {
    run = await runCaptured(python, ['-c', PROBE, ...FINGERPRINT_PACKAGES], { cwd, timeoutMs });
  } catch (e: unknown) {
    return { ok: false, problem: `${python} could not run: ${errorMessage(e)}` };
  }
  try {
    if (run.code !== 0) throw new Error(run.stderr.trim().split('\n').at(-1) ?? `exit ${run.code}`);
    return {
      ok: true,
      value: JSON.parse(run.stdout.trim().split('\n').at(-1) ?? '') as {
        python: string;
        packages: Record<string, string>;
        cuda: string | null;
      },
    };
  } catch (e: unknown) {
    return { ok: false, problem: `${python} could not be probed: ${errorMessage(e)}` };
  }
}

/** Records the environment a training command runs in: Python, packages, CUDA, driver, GPU names. */
export async function collectFingerprint(opts: {
  command: readonly string[];
  python?: string;
  cwd: string;
  gpus: readonly GpuInfo[];
  driver: string | null;
  timeoutMs?: number;
}): Promise<EnvFingerprint> {
  const pythonPath = pythonOf(opts.command, opts.python);
  const probe = await runProbe(pythonPath, opts.cwd, opts.timeoutMs ?? 60_000);
  const base = { pythonPath, driver: opts.driver, gpus: opts.gpus.map((g) => g.name) };
  if (!probe.ok) return { ...base, python: null, cuda: null, packages: {}, problem: probe.problem };
  const packages = Object.fromEntries(Object.entries(probe.value.packages).sort(([a], [b]) => a.localeCompare(b)));
  return { ...base, python: probe.value.python, cuda: probe.value.cuda ?? null, packages };
}

/**
 * What differs between the last good fingerprint and this one, as `what: before → now`
 * (`torch: 2.4.0 → 2.5.1`, `flash-attn: (none) → 2.6.3`). The interpreter's path is not
 * compared (the same environment may sit at another path on another node); its version is.
 */
export function fingerprintChanges(before: EnvFingerprint, now: EnvFingerprint): string[] {
  const show = (v: string | null | undefined): string => (v === null || v === undefined || v === '' ? '(none)' : v);
  const out: string[] = [];
  const cmp = (what: string, a: string | null | undefined, b: string | null | undefined): void => {
    if (show(a) !== show(b)) out.push(`${what}: ${show(a)} → ${show(b)}`);
  };
  cmp('python', before.python, now.python);
  cmp('CUDA', before.cuda, now.cuda);
  cmp('driver', before.driver, now.driver);
  const models = (f: EnvFingerprint): string => [...new Set(f.gpus)].sort().join(', ');
  cmp('GPUs', models(before), models(now));
  const names = [...new Set([...Object.keys(before.packages), ...Object.keys(now.packages)])].sort();
  for (const n of names) cmp(n, before.packages[n], now.packages[n]);
  return out;
}
