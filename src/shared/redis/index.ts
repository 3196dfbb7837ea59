// Redis: connections, the embedded server, the Lua scripts (lua/) and the process lock built on them.
export { checkRedisServer, closeRedisConnection, createRedisConnection, isSupportedRedisVersion, MIN_REDIS_VERSION, type OpenedRedis, openRedis, type OpenRedisOptions, redactRedisUrl, type RedisConnectionOptions, type RedisRole, type RedisServerCheck } from './connection.js';
export { EmbeddedRedis, type EmbeddedRedisEndpoint, type EmbeddedRedisOptions, findFreePort, REDIS_SERVER_NOT_FOUND_MESSAGE } from './embedded-redis.js';
export { type AcquireOptions, describeLockHolder, type LockHolder, LockLostError, parseLockHolder, ProcessLock } from './process-lock.js';
export { type AcquireOutcome, decodeAcquire, type ScriptedRedis, type TokenmillScripts, withScripts } from './scripts.js';
