// Time and retries: the monotonic clock, backoff, abortable sleep, deferred promises, error events.
import { performance } from 'node:perf_hooks';

/** The default clock: milliseconds on a monotonic timeline. */
export const monotonic = { now: () => performance.now() };

/** Exponential backoff with jitter: base ms doubling up to limit ms. */
export class Backoff {
  constructor(base = 100, limit = 5000) {
    this.base = base;
    this.limit = limit;
    this.n = 0;
  }
  next() {
    const d = Math.min(this.limit, this.base * 2 ** Math.min(this.n, 30));
    this.n++;
    return d / 2 + Math.random() * (d / 2);
  }
  reset() { this.n = 0; }
}

/** sleep(ms, signal) resolves true after ms, false at once if signal aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(true); }, Math.max(0, ms));
    const onAbort = () => { clearTimeout(t); resolve(false); };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** A promise with its resolve function outside. */
export function deferred() {
  let resolve, reject;
  const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
  return { promise, resolve, reject };
}

/** emitError emits 'error' only when someone listens (an unheard 'error' would throw). */
export function emitError(emitter, err) {
  if (emitter.listenerCount('error') > 0) emitter.emit('error', err);
}
