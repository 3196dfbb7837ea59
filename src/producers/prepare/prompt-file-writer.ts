/**
 * Writes a file atomically: lines go to a temp file next to it (buffered), which replaces the
 * file by a rename only once it is complete and synced; a reader sees the old file or the new
 * one, never a part.
 */
import { createHash, type Hash } from 'node:crypto';
import { mkdir, open, rename, rm, stat, type FileHandle } from 'node:fs/promises';
import { dirname } from 'node:path';

import { removeAbandonedTempFiles, tempNameFor } from '../../shared/index.js';

const FLUSH_BYTES = 1 << 20;

/** What a committed file is: its SHA-256, size, lines, and the stat that identifies this version. */
export interface WrittenFile {
  file: string;
  sha256: string;
  bytes: number;
  lines: number;
  mtimeMs: number;
  ino: number;
}

/** A file being written under a temp name; {@link commit} puts it in place, {@link abort} drops it. */
export class AtomicLineWriter {
  private readonly hash: Hash = createHash('sha256');
  private pending: string[] = [];
  private pendingBytes = 0;
  private bytes = 0;
  private lines = 0;
  private closed = false;

  private constructor(
    readonly file: string,
    readonly tempFile: string,
    private readonly fh: FileHandle,
  ) {}

  /**
   * Opens a temp file in `file`'s folder (created if missing), after removing the temp files a
   * killed process of this host left there for `file`.
   */
  static async open(file: string): Promise<AtomicLineWriter> {
    await mkdir(dirname(file), { recursive: true });
    await removeAbandonedTempFiles(file);
    const tempFile = tempNameFor(file, 'tmp');
    return new AtomicLineWriter(file, tempFile, await open(tempFile, 'wx'));
  }

  /** Appends one line (a newline is added). */
  async writeLine(text: string): Promise<void> {
    const line = `${text}\n`;
    this.pending.push(line);
    this.pendingBytes += line.length;
    this.lines += 1;
    if (this.pendingBytes >= FLUSH_BYTES) await this.flush();
  }

  /** Lines written so far. */
  get lineCount(): number {
    return this.lines;
  }

  private async flush(): Promise<void> {
    if (this.pending.length === 0) return;
    const buf = Buffer.from(this.pending.join(''), 'utf8');
    this.pending = [];
    this.pendingBytes = 0;
    this.hash.update(buf);
    this.bytes += buf.length;
    let off = 0;
    while (off < buf.length) off += (await this.fh.write(buf, off)).bytesWritten;
  }

  /**
   * Flushes and syncs the temp file, calls `beforeRename` with its SHA-256 (which may refuse by
   * throwing: the temp file is then removed and the old file stays), then renames it over `file`.
   */
  async commit(beforeRename?: (sha256: string) => Promise<void>): Promise<WrittenFile> {
    await this.flush();
    const sha256 = this.hash.digest('hex');
    await this.fh.sync();
    await this.fh.close();
    this.closed = true;
    try {
      await beforeRename?.(sha256);
      await rename(this.tempFile, this.file);
    } catch (e: unknown) {
      await rm(this.tempFile, { force: true });
      throw e;
    }
    await syncDir(dirname(this.file));
    const st = await stat(this.file);
    return { file: this.file, sha256, bytes: this.bytes, lines: this.lines, mtimeMs: st.mtimeMs, ino: st.ino };
  }

  /** Closes and removes the temp file; the old file stays. */
  async abort(): Promise<void> {
    if (!this.closed) {
      this.closed = true;
      await this.fh.close().catch(() => undefined);
    }
    await rm(this.tempFile, { force: true });
  }
}

async function syncDir(dir: string): Promise<void> {
  let fh: FileHandle | undefined;
  try {
    fh = await open(dir, 'r');
    await fh.sync();
  } catch {
    // not every file system syncs a folder; the rename itself is atomic
  } finally {
    await fh?.close().catch(() => undefined);
  }
}
