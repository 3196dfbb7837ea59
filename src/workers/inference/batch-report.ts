import type { Job } from 'bullmq';
import type { BatchProgress, Logger } from '../../shared/index.js';

/**
 * What a person sees of a batch job while it runs: its progress (`job.updateProgress`, at
 * most once per `intervalMs` from the job's start, so it costs no throughput: a batch done
 * within the interval sends only its final counts) and its log (`job.log`, a line per
 * failed or retried prompt). Neither needs the job's lock; both stop once the batch is lost
 * to another worker.
 */
export class BatchReporter {
  private latest: BatchProgress | undefined;
  /** The job's start counts as an update: the first one is sent `intervalMs` into the job. */
  private sentAtMs = Date.now();
  private timer: NodeJS.Timeout | undefined;
  private pending: Promise<unknown>[] = [];
  private closed = false;

  constructor(
    private readonly job: Job,
    private readonly log: Logger,
    private readonly intervalMs = 1_000,
  ) {}

  /** The newest counts; sent now if the last update is `intervalMs` old, else when it is. */
  progress(p: BatchProgress): void {
    if (this.closed) return;
    this.latest = p;
    if (this.timer !== undefined) return;
    const wait = this.sentAtMs + this.intervalMs - Date.now();
    if (wait <= 0) this.send();
    else {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.send();
      }, wait);
      this.timer.unref();
    }
  }

  /** Appends a line to the job's log. */
  line(text: string): void {
    if (this.closed) return;
    this.track(this.job.log(text));
  }

  /** Sends the last counts and waits for every update and log line (call before the job finishes). */
  async flush(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (!this.closed) this.send();
    await Promise.all(this.pending);
  }

  /** Stops reporting (the batch was lost to another worker). */
  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private send(): void {
    const p = this.latest;
    if (p === undefined) return;
    this.latest = undefined;
    this.sentAtMs = Date.now();
    this.track(this.job.updateProgress({ ...p }));
  }

  private track(p: Promise<unknown>): void {
    const tracked = p
      .catch((e: unknown) =>
        this.log.debug({ err: e, jobId: this.job.id }, "could not update a batch job's progress or log"),
      )
      .finally(() => {
        this.pending = this.pending.filter((x) => x !== tracked);
      });
    this.pending.push(tracked);
  }
}
