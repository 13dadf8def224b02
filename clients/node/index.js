// @keyshard/client: Keyshard's Node.js client (no runtime dependencies).
export { bucket, hasher, xxh64, HASH_MODES, MAX_BUCKETS } from './src/hash.js';
export * from './src/errors.js';
export { Client, LONG_POLL_MARGIN } from './src/client.js';
export { Router } from './src/router.js';
export { Worker, Grant, Lease, fenceMargin } from './src/worker.js';
export { HotKeys, Detector, MAX_REPORT_KEYS, MAX_REPORT_KEY_BYTES } from './src/hotkeys.js';
export { PoolFollower, LoadReporter } from './src/pools.js';
