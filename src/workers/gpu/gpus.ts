import { runCaptured, type CapturedRun } from '../../shared/index.js';
import { AppError, EnvironmentError, errorMessage, type GpuMemorySeen } from '../../shared/index.js';

/** One GPU as `nvidia-smi` reports it. */
export interface GpuInfo extends GpuMemorySeen {
  driver: string;
}

/** The query the train worker runs (and the stand-in `nvidia-smi` of the tests answers). */
export const NVIDIA_SMI_ARGS = [
  '--query-gpu=index,name,memory.total,memory.free,driver_version',
  '--format=csv',
] as const;

/** A number of MiB as nvidia-smi writes it: `81559 MiB` or `81559`. */
function mib(v: string, line: number): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(MiB)?\s*$/.exec(v);
  if (m === null) throw new AppError(`nvidia-smi output line ${line}: expected a size in MiB, got "${v.trim()}"`);
  return Math.round(Number(m[1]));
}

/**
 * Parses `nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version
 * --format=csv` (with or without the header line and units).
 */
export function parseNvidiaSmi(text: string): GpuInfo[] {
  const gpus: GpuInfo[] = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('index')) return;
    const cols = line.split(',').map((c) => c.trim());
    if (cols.length < 5)
      throw new AppError(
        `nvidia-smi output line ${i + 1}: expected 5 columns (index, name, memory.total, memory.free, driver_version), got "${line}"`,
      );
    // A GPU name may itself hold a comma: the first column is the index, the last three are fixed.
    const index = Number(cols[0]);
    if (!Number.isInteger(index))
      throw new AppError(`nvidia-smi output line ${i + 1}: expected a GPU index, got "${cols[0] ?? ''}"`);
    const n = cols.length;
    gpus.push({
      index,
      name: cols.slice(1, n - 3).join(', '),
      totalMiB: mib(cols[n - 3] ?? '', i + 1),
      freeMiB: mib(cols[n - 2] ?? '', i + 1),
      driver: cols[n - 1] ?? '',
    });
  });
  return gpus;
}

/** What GPU discovery found: the GPUs, or why there are none. */
export interface GpuProbe {
  gpus: GpuInfo[];
  /** Set when nvidia-smi is missing or failed: why no GPU is listed. */
  problem: string | null;
}

/** Runs `nvidia-smi` (from PATH); a machine without it has no GPU. */
export async function probeGpus(command = 'nvidia-smi', timeoutMs = 20_000): Promise<GpuProbe> {
  let run: CapturedRun;
  try {
    run = await runCaptured(command, NVIDIA_SMI_ARGS, { timeoutMs });
  } catch (e: unknown) {
    const missing = (e as NodeJS.ErrnoException).code === 'ENOENT';
    return {
      gpus: [],
      problem: missing
        ? 'no GPU on this worker (nvidia-smi not found on the PATH)'
        : `nvidia-smi could not run: ${errorMessage(e)}`,
    };
  }
  const stderr = run.stderr.trim();
  if (run.code !== 0) {
    return {
      gpus: [],
      problem: `nvidia-smi failed (${run.signal ?? `exit ${run.code}`})${stderr === '' ? '' : `: ${stderr.split('\n')[0]}`}`,
    };
  }
  try {
    return { gpus: parseNvidiaSmi(run.stdout), problem: null };
  } catch (e: unknown) {
    return { gpus: [], problem: errorMessage(e) };
  }
}

/** Parses `--gpus 0,1,3` (`all`: undefined, every GPU); throws a clear error on anything else. */
export function parseGpuList(text: string): number[] | undefined {
  if (text.trim() === 'all') return undefined;
  const parts = text.split(',').map((s) => s.trim());
  const out: number[] = [];
  for (const p of parts) {
    if (!/^\d+$/.test(p))
      throw new EnvironmentError(`--gpus: expected GPU indices separated by commas (e.g. 0,1) or all, got "${text}"`);
    out.push(Number(p));
  }
  return [...new Set(out)];
}
