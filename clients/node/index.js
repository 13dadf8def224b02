// @keyshard/client: Keyshard's Node.js client (no runtime dependencies).
export { bucket, hasher, xxh64, HASH_MODES, MAX_BUCKETS } from './src/hash.js';
export * from './src/errors.js';
export { Client, LONG_POLL_MARGIN } from './src/client.js';
export { Router } from './src/router.js';
export { Worker, Grant, Lease, fenceMargin } from './src/worker.js';
