/** Writing an export file: streamed line by line, then swapped in whole (temp file + rename). */
import { createWriteStream, type WriteStream } from 'node:fs';
import { mkdir, open, rename, rm } from 'node:fs/promises';
import path from 'node:path';

import { EnvironmentError, errorMessage } from '../../shared/index.js';

/**
 * A JSONL file being written: lines go to a temporary sibling (`.<name>.tmp-<pid>`), and
 * {@link commit} fsyncs it and renames it over the final path, so the file at `file` is either
 * the previous export or the complete new one, never a part. {@link abort} removes the
 * temporary file. Writes wait for the stream to drain, so memory stays bounded.
 */
export class AtomicJsonlWriter {
  readonly tmp: string;
  lines = 0;
  bytes = 0;
  #stream: WriteStream;
  #failed: Error | undefined;

  private constructor(
    readonly file: string,
    tmp: string,
    stream: WriteStream,
  ) {
    this.tmp = tmp;
    this.#stream = stream;
    stream.on('error', (e) => {
      this.#failed = e;
    });
  }

  /** Opens the temporary file beside `file` (creating the folder). */
  static async open(file: string): Promise<AtomicJsonlWriter> {
    const dir = path.dirname(file);
    try {
      await mkdir(dir, { recursive: true });
    } catch (e: unknown) {
      throw new EnvironmentError(`cannot create the folder ${dir} for ${file}: ${errorMessage(e)}`, { cause: e });
    }
    const tmp = path.join(dir, `.${path.basename(file)}.tmp-${process.pid}`);
    const stream = createWriteStream(tmp, { encoding: 'utf8' });
    await new Promise<void>((resolve, reject) => {
      stream.once('open', () => resolve());
      stream.once('error', (e) => reject(new EnvironmentError(`cannot write ${tmp}: ${e.message}`, { cause: e })));
    });
    return new AtomicJsonlWriter(file, tmp, stream);
  }

  /** Appends one value as a JSON line; waits when the stream's buffer is full. */
  async write(value: unknown): Promise<void> {
    if (this.#failed !== undefined)
      throw new EnvironmentError(`cannot write ${this.tmp}: ${this.#failed.message}`, { cause: this.#failed });
    const text = `${JSON.stringify(value)}\n`;
    this.lines += 1;
    this.bytes += Buffer.byteLength(text);
    if (!this.#stream.write(text)) {
      await new Promise<void>((resolve) => this.#stream.once('drain', resolve));
    }
  }

  /** Flushes, fsyncs and renames the temporary file to {@link file}. */
  async commit(): Promise<void> {
    await this.#end();
    if (this.#failed !== undefined)
      throw new EnvironmentError(`cannot write ${this.tmp}: ${this.#failed.message}`, { cause: this.#failed });
    const fh = await open(this.tmp, 'r');
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(this.tmp, this.file);
  }

  /** Closes and removes the temporary file; the file at {@link file} is left as it was. */
  async abort(): Promise<void> {
    await this.#end().catch(() => undefined);
    await rm(this.tmp, { force: true });
  }

  #end(): Promise<void> {
    if (this.#stream.closed) return Promise.resolve();
    return new Promise<void>((resolve) => this.#stream.end(() => resolve()));
  }
}
