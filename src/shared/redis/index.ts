// Redis: connections, the embedded server, the Lua scripts (lua/) and the process lock built on them.
export {
  checkRedisServer,
  closeRedisConnection,
  createRedisConnection,
  isSupportedRedisVersion,
  MIN_REDIS_VERSION,
  type OpenedRedis,
  openRedis,
  type OpenRedisOptions,
  type RedisConnectionOptions,
  type RedisRole,
  type RedisServerCheck,
} from './connection.js';
export { throttledErrorLog } from './error-log.js';
export { openAnswering, FIRST_ANSWER_TIMEOUT_MS } from './first-answer.js';
export {
  configuredRedisUrl,
  isSentinelUrl,
  newIoredis,
  parseSentinelUrl,
  redactRedisUrl,
  type RedisLocation,
  type RedisSentinelTarget,
  sentinelUrl,
} from './target.js';
export {
  EmbeddedRedis,
  type EmbeddedRedisEndpoint,
  type EmbeddedRedisOptions,
  findFreePort,
  REDIS_SERVER_NOT_FOUND_MESSAGE,
} from './embedded-redis.js';
export {
  type AcquireOptions,
  describeLockHolder,
  type LockHolder,
  LockLostError,
  parseLockHolder,
  ProcessLock,
} from './process-lock.js';
export {
  type AcquireOutcome,
  decodeAcquire,
  type ScriptedRedis,
  type TokenmillScripts,
  withScripts,
} from './scripts.js';
