// Run as a child process by test/faults/producer-memory.test.ts and
// bench/producer-memory.ts (with a small --max-old-space-size), through runScanChild in
// prompt-scan.ts: the producer's read of a prompt file (the duplicate index, then a pass that
// only needs each line's id, as the last pass over a committed file does). Prints one JSON
// line: counts, rejects, times, peak memory.
import { PromptFileIndex, scanPromptFile, type RejectedLine } from '../../src/shared/index.js';

async function main(): Promise<void> {
  const file = process.argv[2];
  if (file === undefined) throw new Error('usage: prompt-scan-child.ts <prompts.jsonl>');
  let heapUsedMax = 0;
  let arrayBuffersMax = 0;
  const sample = (): void => {
    const m = process.memoryUsage();
    heapUsedMax = Math.max(heapUsedMax, m.heapUsed);
    arrayBuffersMax = Math.max(arrayBuffersMax, m.arrayBuffers);
  };
  // Between chunks as well as after each one: the index build is sampled too.
  const sampler = setInterval(sample, 20);
  const cpu0 = process.cpuUsage();
  const t0 = Date.now();
  const index = await PromptFileIndex.build(file);
  sample();
  const indexMs = Date.now() - t0;
  const counts = { unique: 0, parsed: 0, rejected: 0 };
  const rejects: RejectedLine[] = [];
  for await (const chunk of scanPromptFile(file, index)) {
    for (const s of chunk) {
      counts[s.kind] += 1;
      if (s.kind === 'rejected' && rejects.length < 100) rejects.push(s.reject);
    }
    sample();
  }
  clearInterval(sampler);
  const cpu = process.cpuUsage(cpu0);
  process.stdout.write(
    `${JSON.stringify({
      lines: index.lines,
      suspects: index.suspects.size,
      ...counts,
      rejects,
      indexMs,
      scanMs: Date.now() - t0 - indexMs,
      cpuMs: Math.round((cpu.user + cpu.system) / 1000),
      heapUsedMaxBytes: heapUsedMax,
      // Buffers and typed arrays, off the V8 heap: the Bloom filter, read chunks.
      arrayBuffersMaxBytes: arrayBuffersMax,
      // ru_maxrss is in KiB on Linux.
      maxRssBytes: process.resourceUsage().maxRSS * 1024,
    })}\n`,
  );
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
