/**
 * A private `redis-server` for runs without `redis.url`: demo, tests, benchmarks, single-machine
 * runs. Its state (AOF) lives in the run folder, so every later command on the same config
 * (`status`, a resumed `run`, `postprocess`) reopens the same state: it attaches to the server
 * that is still running there, or starts a new one that replays the AOF.
 *
 * Files in `dataDir`:
 * - `redis.conf`   the config the server was started with (rewritten on each start)
 * - `redis.log`    everything the server printed (appended)
 * - `redis.pid`    pid of the running server (removed by the owner's `stop()`)
 * - `redis.port`   its TCP port on 127.0.0.1 (removed by the owner's `stop()`)
 * - `redis.start.lock`  held only while a process starts, attaches to or stops a server, so that
 *                  two commands started together do not run two servers on the same AOF, and an
 *                  owner never stops the server under a process that is attaching to it
 * - `redis.users/<pid>-<n>`  one per process attached to the server (removed by its `stop()`;
 *                  a file whose pid is dead is ignored): the owner's `stop()` leaves the server
 *                  running while one names a live process, even before it has connected
 * - `appendonlydir/`  the AOF itself
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { AppError, EnvironmentError, TimeoutError, errorMessage } from '../errors.js';
import { logger as componentLogger, type Logger } from '../logger.js';
import { delay, isProcessAlive, withTimeout } from '../util/index.js';
import { fileSize, indent, mtimeMs, readIntFile, readLogTail, renderConfig } from './embedded-redis-files.js';
import {
  countOtherClients,
  findFreePort,
  HOST,
  looksLikeRedisServer,
  pingOnce,
  readServerInfo,
} from './embedded-redis-probe.js';

export { findFreePort } from './embedded-redis-probe.js';

/** Options of {@link EmbeddedRedis}. */
export interface EmbeddedRedisOptions {
  /** Folder that holds the server's AOF, config, log, pid and port files; created if missing. */
  dataDir: string;
  /** The `redis-server` executable: a name looked up on PATH or a path. Default `redis-server`. */
  redisServerPath?: string;
  /** TCP port on 127.0.0.1. Default: a free port chosen at start (retried if taken meanwhile). */
  port?: number;
  /** Extra command-line arguments appended after the config file, e.g. `['--maxmemory-policy', 'allkeys-lru']`. */
  extraArgs?: readonly string[];
  /** How long to wait for the server to answer PING (AOF replay included). Default 30 s. */
  readyTimeoutMs?: number;
  /** How long `stop()` waits for the server to exit before it kills it. Default 10 s. */
  stopTimeoutMs?: number;
  /**
   * When the owner stops while other processes are still connected (a worker or a second
   * command attached to the same run), leave the server running for them instead of stopping
   * it. Default false: `stop()` always stops a server this instance started.
   */
  keepWhileInUse?: boolean;
  /**
   * When the server this instance started exits on its own (OOM-killed, say) and `stop()` was not
   * called, start it again on the same port and AOF, so every connection reconnects to the same
   * URL with the state the AOF holds (all but its last second at most). Default false.
   */
  restartOnExit?: boolean;
  /** Test hook: awaited by `stop()` after it decided to stop the server, before it signals it. */
  beforeStopForTest?: () => Promise<void>;
  logger?: Logger;
}

/** Where a started (or attached) server listens. */
export interface EmbeddedRedisEndpoint {
  url: string;
  port: number;
}

/** The one-line message shown when `redis-server` cannot be found. */
export const REDIS_SERVER_NOT_FOUND_MESSAGE =
  "redis-server not found on PATH: install Redis ≥ 6.2 (e.g. 'apt-get install redis-server' or 'brew install redis') or set redis.url in the config";

const POLL_INTERVAL_MS = 25;
const START_ATTEMPTS_WITH_FREE_PORT = 3;
/** A start lock whose owner pid cannot be read is considered abandoned after this long. */
const UNREADABLE_LOCK_STALE_MS = 10_000;
/** Restarts after an unexpected exit: at most this many within {@link RESTART_WINDOW_MS}. */
const MAX_RESTARTS_IN_WINDOW = 5;
const RESTART_WINDOW_MS = 60_000;
let userFileSeq = 0;

/**
 * A `redis-server` private to one run folder, bound to 127.0.0.1, with AOF on
 * (`appendfsync everysec`), no RDB snapshots and `maxmemory-policy noeviction`.
 *
 * `start()` attaches to a server that an earlier `start()` left running on the same `dataDir`
 * (its pid is alive and it answers PING as that pid); otherwise it starts one, which replays the
 * AOF. Only the instance that started the process stops it: `stop()` of an attached instance
 * leaves the server up.
 *
 * The server runs in its own process group, so a Ctrl-C in the terminal reaches tokenmill, which
 * shuts down in order (workers, queues, then Redis) while Redis is still there to take the last
 * commits. If tokenmill dies without `stop()`, the server keeps running and the next command on
 * the same run folder attaches to it.
 */
export class EmbeddedRedis {
  readonly dataDir: string;
  private readonly redisServerPath: string;
  private readonly requestedPort: number | undefined;
  private readonly extraArgs: readonly string[];
  private readonly readyTimeoutMs: number;
  private readonly stopTimeoutMs: number;
  private readonly keepWhileInUse: boolean;
  private readonly restartOnExit: boolean;
  private readonly beforeStopForTest: (() => Promise<void>) | undefined;
  private readonly log: Logger;
  /** This instance's file in `redis.users/` while it is attached. */
  private userFile: string | undefined;
  private stopping = false;
  private restartTimes: number[] = [];

  private child: ChildProcess | undefined;
  private childExit: Promise<void> | undefined;
  private realDataDir: string | undefined;
  private endpoint: EmbeddedRedisEndpoint | undefined;
  private serverPid: number | undefined;
  private owned = false;
  private starting: Promise<EmbeddedRedisEndpoint> | undefined;

  constructor(options: EmbeddedRedisOptions) {
    this.dataDir = path.resolve(options.dataDir);
    this.redisServerPath = options.redisServerPath ?? 'redis-server';
    this.requestedPort = options.port;
    this.extraArgs = options.extraArgs ?? [];
    this.readyTimeoutMs = options.readyTimeoutMs ?? 30_000;
    this.stopTimeoutMs = options.stopTimeoutMs ?? 10_000;
    this.keepWhileInUse = options.keepWhileInUse ?? false;
    this.restartOnExit = options.restartOnExit ?? false;
    this.beforeStopForTest = options.beforeStopForTest;
    this.log = options.logger ?? componentLogger('embedded-redis');
  }

  /** `redis://127.0.0.1:<port>`; throws if not started. */
  get url(): string {
    return this.requireEndpoint().url;
  }

  /** The TCP port; throws if not started. */
  get port(): number {
    return this.requireEndpoint().port;
  }

  /** Pid of the server process, once started or attached. */
  get pid(): number | undefined {
    return this.serverPid;
  }

  /** True when this instance started the server (and `stop()` will end it); false when it attached. */
  get ownsProcess(): boolean {
    return this.owned;
  }

  /** Starts the server, or attaches to the one already running on `dataDir`. Idempotent. */
  async start(): Promise<EmbeddedRedisEndpoint> {
    if (this.endpoint !== undefined) return this.endpoint;
    this.starting ??= this.doStart().finally(() => {
      this.starting = undefined;
    });
    return this.starting;
  }

  /**
   * Stops the server if this instance started it: SIGTERM, on which Redis flushes and fsyncs
   * the AOF and exits (what SHUTDOWN does), then waits for the exit; kills it if it does not
   * exit within `stopTimeoutMs`. An attached instance only forgets the server.
   */
  async stop(): Promise<void> {
    if (this.starting !== undefined) {
      await this.starting.catch(() => undefined);
    }
    this.stopping = true;
    const child = this.child;
    const exited = this.childExit;
    const owned = this.owned;
    const port = this.endpoint?.port;
    this.endpoint = undefined;
    this.child = undefined;
    this.childExit = undefined;
    this.owned = false;
    if (!owned || child === undefined || exited === undefined) {
      const pid = this.serverPid;
      this.serverPid = undefined;
      await this.removeUserFile();
      // Attached to a server whose owner has gone: the last process to leave stops it.
      if (this.keepWhileInUse && port !== undefined && pid !== undefined) {
        await this.underStartLock(async () => {
          if ((await this.liveUsers()) === 0 && (await countOtherClients(port)) === 0)
            await this.shutdownAttached(port, pid);
        });
      }
      return;
    }
    // Under the start lock: a process attaching now either registered itself before (and is
    // counted) or attaches after the server is gone (and starts a new one on the same AOF).
    await this.underStartLock(async () => {
      // A restart after an unexpected exit may have finished while we waited for the lock.
      const current = this.child ?? child;
      const currentExit = this.childExit ?? exited;
      this.child = undefined;
      this.childExit = undefined;
      this.owned = false;
      this.endpoint = undefined;
      await this.stopOwned(current, currentExit, port);
    });
  }

  private async stopOwned(child: ChildProcess, exited: Promise<void>, port: number | undefined): Promise<void> {
    if (this.keepWhileInUse && child.exitCode === null && child.signalCode === null && port !== undefined) {
      // Other tokenmill processes attached to this server (a worker, a second command on the
      // same run, one still connecting) are using it: leave it running for them. Its data is in
      // the AOF, and the next command on this run attaches to it.
      const users = await this.liveUsers();
      const others = users > 0 ? users : await countOtherClients(port);
      if (others > 0) {
        this.log.info({ pid: child.pid, clients: others }, 'embedded redis left running: other processes still use it');
        child.unref();
        this.serverPid = undefined;
        return;
      }
    }
    await this.beforeStopForTest?.();
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      if ((await withTimeout(exited, this.stopTimeoutMs)) === 'timeout') {
        this.log.warn(
          { pid: child.pid, stopTimeoutMs: this.stopTimeoutMs },
          'redis-server did not exit after SIGTERM; killing it',
        );
        child.kill('SIGKILL');
        await exited;
      }
    }
    this.serverPid = undefined;
    await this.removeRunFiles(child.pid);
    this.log.info({ pid: child.pid, dataDir: this.dataDir }, 'embedded redis stopped');
  }

  private requireEndpoint(): EmbeddedRedisEndpoint {
    if (this.endpoint === undefined) throw new AppError('embedded redis is not started');
    return this.endpoint;
  }

  private file(name: string): string {
    return path.join(this.realDataDir ?? this.dataDir, name);
  }

  private async doStart(): Promise<EmbeddedRedisEndpoint> {
    this.stopping = false;
    await fs.mkdir(this.dataDir, { recursive: true });
    this.realDataDir = await fs.realpath(this.dataDir);
    const deadline = Date.now() + this.readyTimeoutMs;

    // Attaching happens under the start lock, and registers this process in `redis.users/`
    // before the lock is released: an owner stopping at the same moment either sees it, or
    // has stopped the server before we look (and we start a new one on the same AOF).
    const release = await this.acquireStartLock(deadline);
    try {
      const attached = await this.tryAttach(deadline);
      if (attached) {
        await this.addUserFile();
        return attached;
      }
      return await this.spawnServer();
    } finally {
      await release();
    }
  }

  /** Runs `fn` holding the start lock; if the lock cannot be had in time, runs it anyway (logged). */
  private async underStartLock(fn: () => Promise<void>): Promise<void> {
    let release: (() => Promise<void>) | undefined;
    try {
      release = await this.acquireStartLock(Date.now() + this.readyTimeoutMs + this.stopTimeoutMs);
    } catch (e: unknown) {
      this.log.warn({ err: e, dataDir: this.dataDir }, 'could not take the redis start lock; stopping without it');
    }
    try {
      await fn();
    } finally {
      await release?.();
    }
  }

  private usersDir(): string {
    return this.file('redis.users');
  }

  private async addUserFile(): Promise<void> {
    await fs.mkdir(this.usersDir(), { recursive: true });
    userFileSeq += 1;
    const file = path.join(this.usersDir(), `${process.pid}-${userFileSeq}`);
    await fs.writeFile(file, `${process.pid}\n`);
    this.userFile = file;
  }

  private async removeUserFile(): Promise<void> {
    if (this.userFile === undefined) return;
    await fs.rm(this.userFile, { force: true });
    this.userFile = undefined;
  }

  /** Processes attached to the server now (files in `redis.users/` whose pid is alive); removes the others. */
  private async liveUsers(): Promise<number> {
    let names: string[];
    try {
      names = await fs.readdir(this.usersDir());
    } catch {
      return 0;
    }
    let live = 0;
    for (const name of names) {
      const pid = Number(/^(\d+)-/.exec(name)?.[1] ?? NaN);
      if (Number.isInteger(pid) && isProcessAlive(pid)) live += 1;
      else await fs.rm(path.join(this.usersDir(), name), { force: true });
    }
    return live;
  }

  /** Attaches to the server recorded in the pid and port files, if it is alive and really ours. */
  private async tryAttach(deadline: number): Promise<EmbeddedRedisEndpoint | undefined> {
    const pid = await readIntFile(this.file('redis.pid'));
    const port = await readIntFile(this.file('redis.port'));
    if (pid === undefined || port === undefined || !isProcessAlive(pid)) return undefined;

    // The server may still be replaying its AOF (PING answers LOADING), or just starting.
    for (;;) {
      const state = await pingOnce(port, 1_000);
      if (state === 'pong') break;
      if (state === 'down' && !(await looksLikeRedisServer(pid))) return undefined;
      if (!isProcessAlive(pid)) return undefined;
      if (Date.now() >= deadline) {
        throw new TimeoutError(
          `a redis-server (pid ${pid}) holds ${this.dataDir} but did not answer on port ${port} within ${this.readyTimeoutMs} ms; stop it or remove ${this.file('redis.pid')}`,
        );
      }
      await delay(POLL_INTERVAL_MS);
    }

    // The port answers: make sure it is the process of our pid file, started with our config.
    const info = await readServerInfo(port);
    if (info === undefined || info.processId !== pid) return undefined;
    if (info.configFile !== undefined && info.configFile !== this.file('redis.conf')) return undefined;

    this.endpoint = { url: `redis://${HOST}:${port}`, port };
    this.serverPid = pid;
    this.owned = false;
    this.log.info({ pid, port, dataDir: this.dataDir }, 'attached to running embedded redis');
    return this.endpoint;
  }

  private async spawnServer(): Promise<EmbeddedRedisEndpoint> {
    const attempts = this.requestedPort === undefined ? START_ATTEMPTS_WITH_FREE_PORT : 1;
    for (let attempt = 1; ; attempt++) {
      let port = this.requestedPort ?? (await findFreePort());
      // Never the default Redis port: that is someone else's server.
      while (this.requestedPort === undefined && port === 6379) port = await findFreePort();
      try {
        return await this.spawnOnPort(port);
      } catch (e: unknown) {
        if (attempt < attempts && e instanceof EarlyExitError && /address already in use/i.test(e.logTail)) {
          this.log.debug({ port }, 'port taken before redis-server could bind it; retrying with another');
          continue;
        }
        throw e instanceof EarlyExitError ? new EnvironmentError(e.message) : e;
      }
    }
  }

  private async spawnOnPort(port: number): Promise<EmbeddedRedisEndpoint> {
    const confPath = this.file('redis.conf');
    const logPath = this.file('redis.log');
    await fs.writeFile(confPath, renderConfig(this.realDataDir ?? this.dataDir, port));
    const logStartOffset = await fileSize(logPath);
    const logFd = await fs.open(logPath, 'a');

    let child: ChildProcess;
    try {
      child = spawn(this.redisServerPath, [confPath, ...this.extraArgs], {
        cwd: this.realDataDir,
        stdio: ['ignore', logFd.fd, logFd.fd],
        detached: true,
      });
      const exited = once(child, 'exit').then(() => undefined);
      // Keeps an early failure from becoming an unhandled rejection before we await it.
      exited.catch(() => undefined);
      try {
        await once(child, 'spawn');
      } catch (e: unknown) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code === 'ENOENT') throw new EnvironmentError(this.notFoundMessage(), { cause: e });
        if (code === 'EACCES') {
          throw new EnvironmentError(`cannot execute ${this.redisServerPath}: permission denied`, { cause: e });
        }
        throw new EnvironmentError(`cannot start ${this.redisServerPath}: ${errorMessage(e)}`, { cause: e });
      }
      child.unref();
      this.child = child;
      this.childExit = exited;
    } finally {
      await logFd.close();
    }

    const pid = child.pid;
    if (pid === undefined) throw new EnvironmentError(`cannot start ${this.redisServerPath}: no pid`);
    await fs.writeFile(this.file('redis.pid'), `${pid}\n`);

    try {
      await this.waitUntilReady(child, port, logPath, logStartOffset);
    } catch (e: unknown) {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await this.childExit;
      }
      this.child = undefined;
      this.childExit = undefined;
      await this.removeRunFiles(pid);
      throw e;
    }

    await fs.writeFile(this.file('redis.port'), `${port}\n`);
    this.endpoint = { url: `redis://${HOST}:${port}`, port };
    this.serverPid = pid;
    this.owned = true;
    this.log.info({ pid, port, dataDir: this.dataDir }, 'embedded redis started');
    if (this.restartOnExit) void this.childExit?.then(() => this.restartAfterExit(child, port));
    return this.endpoint;
  }

  /**
   * The server this instance started exited although `stop()` was not called (OOM-killed,
   * say): starts it again on the same port and AOF, so every connection reconnects to the same
   * URL. Tries every second while it fails (the port taken meanwhile, a full disk), saying so.
   */
  private async restartAfterExit(child: ChildProcess, port: number): Promise<void> {
    if (this.stopping || this.child !== child) return;
    const how = child.signalCode !== null ? `killed by ${child.signalCode}` : `exit code ${child.exitCode}`;
    const now = Date.now();
    this.restartTimes = this.restartTimes.filter((t) => now - t < RESTART_WINDOW_MS);
    if (this.restartTimes.length >= MAX_RESTARTS_IN_WINDOW) {
      this.log.error(
        { pid: child.pid, port, log: this.file('redis.log') },
        `embedded redis-server exited (${how}) ${MAX_RESTARTS_IN_WINDOW} times within ${RESTART_WINDOW_MS / 1000} s; not restarting it (see its log)`,
      );
      return;
    }
    this.restartTimes.push(now);
    this.log.warn(
      { pid: child.pid, port, dataDir: this.dataDir },
      `embedded redis-server exited unexpectedly (${how}); restarting it on port ${port} with its AOF`,
    );
    for (let attempt = 1; !this.stopping; attempt++) {
      try {
        await this.underStartLock(async () => {
          if (!this.stopping) await this.spawnOnPort(port);
        });
        return;
      } catch (e: unknown) {
        if (attempt === 1 || attempt % 30 === 0) {
          this.log.error(
            { err: errorMessage(e), port, attempt },
            'embedded redis-server could not be restarted; retrying every second',
          );
        }
        await delay(1_000);
      }
    }
  }

  private async waitUntilReady(
    child: ChildProcess,
    port: number,
    logPath: string,
    logStartOffset: number,
  ): Promise<void> {
    const deadline = Date.now() + this.readyTimeoutMs;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) {
        const tail = await readLogTail(logPath, logStartOffset);
        const how = child.exitCode !== null ? `with code ${child.exitCode}` : `on ${child.signalCode}`;
        throw new EarlyExitError(
          `redis-server exited ${how} before it was ready (port ${port}, log ${logPath}):\n${indent(tail)}`,
          tail,
        );
      }
      if ((await pingOnce(port, 1_000)) === 'pong') {
        // The port answers: make sure it is our child and not a server that took the port.
        const info = await readServerInfo(port);
        if (info?.processId === child.pid) return;
      }
      if (Date.now() >= deadline) {
        const tail = await readLogTail(logPath, logStartOffset);
        throw new TimeoutError(
          `redis-server (pid ${child.pid}) did not answer PING on port ${port} within ${this.readyTimeoutMs} ms (log ${logPath}):\n${indent(tail)}`,
        );
      }
      await delay(POLL_INTERVAL_MS);
    }
  }

  private notFoundMessage(): string {
    const bareName = !this.redisServerPath.includes('/') && !this.redisServerPath.includes('\\');
    const what = bareName
      ? `${this.redisServerPath} not found on PATH`
      : `redis-server not found at ${this.redisServerPath}`;
    return REDIS_SERVER_NOT_FOUND_MESSAGE.replace('redis-server not found on PATH', what);
  }

  /** Removes the pid and port files, but only if they still describe `pid`. */
  /** Stops a server this instance attached to (SIGTERM flushes the AOF), then removes its run files. */
  private async shutdownAttached(port: number, pid: number): Promise<void> {
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      return; // already gone
    }
    const deadline = Date.now() + this.stopTimeoutMs;
    while (Date.now() < deadline && (await pingOnce(port, 500)) !== 'down') await delay(50);
    await this.removeRunFiles(pid);
    this.log.info({ pid, dataDir: this.dataDir }, 'embedded redis stopped by its last user');
  }

  private async removeRunFiles(pid: number | undefined): Promise<void> {
    const recorded = await readIntFile(this.file('redis.pid'));
    if (recorded !== undefined && recorded !== pid) return;
    await fs.rm(this.file('redis.pid'), { force: true });
    await fs.rm(this.file('redis.port'), { force: true });
  }

  /**
   * Takes `redis.start.lock` (O_EXCL create). A lock whose owner is dead is taken over; a live
   * owner is waited for until `deadline`.
   */
  private async acquireStartLock(deadline: number): Promise<() => Promise<void>> {
    const lockPath = this.file('redis.start.lock');
    for (;;) {
      try {
        await fs.writeFile(lockPath, `${process.pid}\n`, { flag: 'wx' });
        return async () => {
          await fs.rm(lockPath, { force: true });
        };
      } catch (e: unknown) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      }
      const owner = await readIntFile(lockPath);
      const stale =
        owner === undefined
          ? Date.now() - (await mtimeMs(lockPath)) > UNREADABLE_LOCK_STALE_MS
          : !isProcessAlive(owner);
      if (stale) {
        this.log.debug({ lockPath, owner }, 'removing abandoned redis start lock');
        await fs.rm(lockPath, { force: true });
        continue;
      }
      if (Date.now() >= deadline) {
        throw new TimeoutError(
          `another process (pid ${owner}) is starting redis-server in ${this.dataDir}; gave up waiting`,
        );
      }
      await delay(POLL_INTERVAL_MS);
    }
  }
}

/** The server exited while we waited for it; carries its log so the caller can decide to retry. */
class EarlyExitError extends AppError {
  constructor(
    message: string,
    readonly logTail: string,
  ) {
    super(message);
  }
}
