// Transport: POSTs over node:http / node:https with keep-alive agents.
//
// The client makes many small calls (keep-alives, grant long polls,
// releases), and a worker's handoff of many buckets makes many at once.
// node:http costs about a quarter of the CPU of the built-in fetch per call
// on loopback (0.4 ms against 1.9 ms here), which is most of a handoff's
// time when one process hands over tens of buckets; so the client speaks
// node:http directly.
import http from 'node:http';
import https from 'node:https';

/**
 * A keep-alive connection pool for POSTs of JSON. maxSockets bounds the
 * connections per origin (default: no bound); requests beyond it wait for
 * a free one.
 */
export class Transport {
  constructor({ maxSockets = Infinity } = {}) {
    this._http = new http.Agent({ keepAlive: true, scheduling: 'lifo', maxSockets });
    this._https = new https.Agent({ keepAlive: true, scheduling: 'lifo', maxSockets });
    this._targets = new Map();
  }

  /**
   * post(base, path, payload, headers, signal) sends payload (a string) to
   * base + "/" + path and resolves with {status, text} once the whole
   * answer has arrived. It rejects on a connection error (err.code says
   * which: ECONNREFUSED, ECONNRESET...), on an answer cut short, and when
   * signal aborts (an AbortError).
   */
  post(base, path, payload, headers, signal) {
    let t = this._targets.get(base);
    if (t === undefined) {
      const u = new URL(base);
      const tls = u.protocol === 'https:';
      t = {
        mod: tls ? https : http,
        agent: tls ? this._https : this._http,
        hostname: u.hostname.replace(/^\[|\]$/g, ''),
        port: u.port || (tls ? 443 : 80),
        prefix: u.pathname.replace(/\/+$/, ''),
      };
      this._targets.set(base, t);
    }
    return new Promise((resolve, reject) => {
      const req = t.mod.request({
        method: 'POST',
        hostname: t.hostname,
        port: t.port,
        path: `${t.prefix}/${path}`,
        agent: t.agent,
        headers: { ...headers, 'Content-Length': Buffer.byteLength(payload) },
        signal,
      }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, text: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
        res.on('close', () => {
          if (!res.complete) {
            const e = new Error('the connection closed before the whole answer arrived');
            e.code = 'ECONNRESET';
            reject(e);
          }
        });
      });
      req.on('error', reject);
      req.end(payload);
    });
  }

  /** Closes every connection, idle or in use. */
  close() {
    this._http.destroy();
    this._https.destroy();
  }
}
