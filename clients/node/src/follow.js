// The long-poll loop shared by the followers (Router, HotKeys,
// PoolFollower): poll, apply the answer, and on failure keep the last
// state, say so ('stale', then 'recovered' once an answer arrives again),
// and retry with backoff.
import { Backoff, emitError, sleep } from './timing.js';

/**
 * follow(f, signal, {poll, apply, firstError, staleKey}) runs until signal
 * aborts. poll(first) resolves with the next answer (first: none has
 * arrived yet), which apply(answer) takes. A failure before the first
 * answer goes to firstError(e) first, which returns true to end the loop.
 * f[staleKey] (default 'stale') is null while fresh, {since, error} while
 * failing; every failure is also emitted as 'error' (emitError).
 */
export async function follow(f, signal, { poll, apply, firstError = () => false, staleKey = 'stale' }) {
  const b = new Backoff(100, 5000);
  let first = true;
  while (!signal.aborted) {
    try {
      const r = await poll(first);
      first = false;
      b.reset();
      if (f[staleKey]) {
        f[staleKey] = null;
        f.emit('recovered');
      }
      apply(r);
    } catch (e) {
      if (signal.aborted) return;
      if (first && firstError(e)) return;
      if (!f[staleKey]) {
        f[staleKey] = { since: new Date(), error: e };
        f.emit('stale', f[staleKey]);
      } else f[staleKey].error = e;
      emitError(f, e);
      if (!(await sleep(b.next(), signal))) return;
    }
  }
}
