// Run as a child process by test/integration/producer-memory.test.ts and
// bench/producer-memory.ts (with a small --max-old-space-size): the producer's read of a
// prompt file (the duplicate index, then a pass that only needs each line's id, as the last
// pass over a committed file does). Prints one JSON line: counts, rejects, peak memory.
import { PromptFileIndex, scanPromptFile, type RejectedLine } from '../../src/shared/index.js';

async function main(): Promise<void> {
  const file = process.argv[2];
  if (file === undefined) throw new Error('usage: prompt-scan-child.ts <prompts.jsonl>');
  let heapUsedMax = 0;
  const sample = (): void => {
    heapUsedMax = Math.max(heapUsedMax, process.memoryUsage().heapUsed);
  };
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
  process.stdout.write(
    `${JSON.stringify({
      lines: index.lines,
      suspects: index.suspects.size,
      ...counts,
      rejects,
      indexMs,
      scanMs: Date.now() - t0 - indexMs,
      heapUsedMaxBytes: heapUsedMax,
      // ru_maxrss is in KiB on Linux.
      maxRssBytes: process.resourceUsage().maxRSS * 1024,
    })}\n`,
  );
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
