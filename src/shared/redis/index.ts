// Redis: the embedded server, connections, server checks and the run's key namespace.
export * from './connection.js';
export * from './embedded-redis.js';
