// Keyshard's dashboard: plain JavaScript, no build step, no dependencies.
// It calls the API the page was served from (HTTP/JSON, the Connect
// protocol) with the bearer token the operator gives it.

const TOKEN_KEY = 'keyshard.token';
const READONLY_KEY = 'keyshard.readonly'; // the token a drain was refused to
const LONG_POLL = '25s';
const READ_ONLY_MSG = 'draining needs an admin token; this token is read-only';

const $ = (sel, el = document) => el.querySelector(sel);
const view = $('#view');
const banner = $('#banner');

// ---- HTML with escaping ----------------------------------------------------

class Raw { constructor(s) { this.s = s; } toString() { return this.s; } }
const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ESC[c]);
const part = (v) => v instanceof Raw ? v.s : Array.isArray(v) ? v.map(part).join('') : esc(v);
function html(strings, ...vals) {
  let out = strings[0];
  vals.forEach((v, i) => { out += part(v) + strings[i + 1]; });
  return new Raw(out);
}
// setHTML replaces el's content only when it changed (keeps hover and
// focus when a refresh brings nothing new) and colours its swatches (CSP:
// no inline style attributes, so colours are set through the CSSOM).
function setHTML(el, h) {
  const s = String(h);
  if (!el || el.__html === s) return false;
  el.__html = s;
  el.innerHTML = s;
  el.querySelectorAll('[data-color]').forEach((x) => { x.style.background = x.dataset.color; });
  return true;
}

// ---- the API -----------------------------------------------------------------

class ApiError extends Error {
  constructor(code, message, status, network) {
    super(message);
    this.code = code; this.status = status; this.network = network;
  }
}

const token = () => sessionStorage.getItem(TOKEN_KEY) || '';
const readOnly = () => token() !== '' && sessionStorage.getItem(READONLY_KEY) === token();

function connectionUp() { banner.hidden = true; }
function connectionDown() { banner.hidden = false; }

// api calls service.method; it throws an ApiError whose network is true
// when the server could not be reached or answered 5xx (not 501
// unimplemented, which is an answer).
async function api(service, method, body, signal) {
  const headers = { 'Content-Type': 'application/json' };
  const tok = token();
  if (tok) headers.Authorization = 'Bearer ' + tok;
  let res;
  try {
    res = await fetch(`/keyshard.v1.${service}/${method}`, { method: 'POST', headers, body: JSON.stringify(body || {}), signal });
  } catch (e) {
    if (signal?.aborted) throw e;
    connectionDown();
    throw new ApiError('unavailable', `cannot reach Keyshard: ${e.message}`, 0, true);
  }
  if (res.ok) {
    const out = await res.json();
    connectionUp();
    return out;
  }
  let code = 'unknown', message = `HTTP ${res.status}`;
  try {
    const j = await res.json();
    code = j.code || code; message = j.message || message;
  } catch { /* not JSON: a proxy's page */ }
  const network = code !== 'unimplemented' && (res.status >= 500 || code === 'unavailable');
  if (network) connectionDown(); else connectionUp();
  if (code === 'unauthenticated') askToken(message);
  throw new ApiError(code, message, res.status, network);
}

// soft runs an API call whose failure is the panel's business; a network
// failure or a missing token stop the loop that made it instead.
async function soft(promise) {
  try {
    return { v: await promise };
  } catch (e) {
    if (e.network || e.code === 'unauthenticated' || e.name === 'AbortError') throw e;
    return { err: e };
  }
}

function why(err) {
  if (err.code === 'unimplemented') return 'not available on this server';
  if (err.code === 'permission_denied') return `not readable with this token (${err.message})`;
  if (err.code === 'not_found') return `not found: ${err.message}`;
  return `${err.code}: ${err.message}`;
}
const errHTML = (err) => html`<p class="${err.code === 'unimplemented' ? 'muted' : 'error'} panel-error">${why(err)}</p>`;

// ---- auth --------------------------------------------------------------------

let tokenWaiters = [];
function askToken(message) {
  $('#auth-why').textContent = message ? `The server says: ${message}` : '';
  $('#auth').hidden = false;
  $('#auth-token').focus();
}
function tokenSet(signal) {
  return new Promise((resolve) => {
    tokenWaiters.push(resolve);
    signal?.addEventListener('abort', resolve, { once: true });
  });
}
function showWho() {
  $('#who').textContent = token() ? (readOnly() ? 'token set (read-only)' : 'token set') : 'no token';
}
$('#auth-form').addEventListener('submit', (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $('#auth-token').value.trim());
  $('#auth-token').value = '';
  $('#auth').hidden = true;
  showWho();
  const ws = tokenWaiters; tokenWaiters = [];
  ws.forEach((w) => w());
  route(); // the new token may read more: start the view over
});
$('#auth-forget').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(READONLY_KEY);
  showWho();
  route();
});
$('#token-button').addEventListener('click', () => askToken(''));

// ---- loops -------------------------------------------------------------------

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });
}
const backoff = (n) => Math.min(250 * 2 ** n, 5000) * (0.75 + Math.random() / 2);

// loop runs step until signal aborts: after a success it waits pause ms
// (0 for a long poll), after a failure it backs off; without a token it
// waits for one.
async function loop(signal, pause, step) {
  let fails = 0;
  while (!signal.aborted) {
    try {
      await step();
      fails = 0;
      if (pause) await sleep(pause, signal);
    } catch (e) {
      if (signal.aborted) return;
      if (e.code === 'unauthenticated') { await tokenSet(signal); continue; }
      fails++;
      if (!e.network) console.warn('keyshard dashboard:', e);
      await sleep(backoff(fails), signal);
    }
  }
}

// ---- formatting --------------------------------------------------------------

const num = (v) => Number(v || 0);
const fmtInt = (v) => num(v).toLocaleString('en-US');
const fmtRate = (v) => num(v).toLocaleString('en-US', { maximumFractionDigits: 1 });
const fmtMs = (s) => (s ? `${(num(String(s).replace(/s$/, '')) * 1000).toFixed(1)} ms` : '—');
const fmtDur = (s) => (s ? `${num(String(s).replace(/s$/, '')).toFixed(1)}s` : '—');
function fmtTime(ts) {
  if (!ts) return '—';
  const d = new Date(ts);
  return isNaN(d) ? String(ts) : d.toLocaleString();
}
function fmtAgo(ts) {
  if (!ts) return '—';
  const s = Math.max(0, (Date.now() - new Date(ts).getTime()) / 1000);
  return s < 90 ? `${s.toFixed(0)}s ago` : s < 5400 ? `${(s / 60).toFixed(0)}m ago` : `${(s / 3600).toFixed(1)}h ago`;
}
const fmtBytes = (b) => (num(b) >= 1 << 20 ? `${(num(b) / (1 << 20)).toFixed(1)} MiB` : `${(num(b) / 1024).toFixed(0)} KiB`);
const enumName = (v, prefix) => String(v || '').replace(prefix, '').toLowerCase().replace(/_/g, ' ') || 'unspecified';
const ksLink = (name) => html`<a href="#/keyspace/${encodeURIComponent(name)}">${name}</a>`;

// ---- colours -----------------------------------------------------------------

// A member's colour comes from its id alone (FNV-1a), so it is the same
// in every view, on every reload and in every browser.
function fnv1a(s) {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; }
  // A finalizer (murmur3's) so ids that differ in one character (w1, w3)
  // get far-apart hues.
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b); h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35); h ^= h >>> 16;
  return h >>> 0;
}
function hsl(h, s, l) {
  s /= 100; l /= 100;
  const k = (n) => (n + h / 30) % 12;
  const a = s * Math.min(l, 1 - l);
  const f = (n) => Math.round(255 * (l - a * Math.max(-1, Math.min(k(n) - 3, Math.min(9 - k(n), 1)))));
  return [f(0), f(8), f(4)];
}
function memberRGB(id) {
  const h = fnv1a(id);
  return hsl(h % 360, 55 + ((h >>> 9) % 30), 45 + ((h >>> 17) % 20));
}
const css = ([r, g, b]) => `rgb(${r},${g},${b})`;
const LITTLE = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
const pack = ([r, g, b]) => (LITTLE ? ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0 : ((r << 24) | (g << 16) | (b << 8) | 255) >>> 0);
const UNASSIGNED_RGB = [58, 62, 70];

// ---- the bucket grid -----------------------------------------------------------

// Bucket variants: how a bucket is drawn besides its owner's colour.
const V_PLAIN = 0, V_RELEASING = 1, V_AWAITING = 2;
const STATE_VARIANT = { BUCKET_STATE_RELEASING: V_RELEASING, BUCKET_STATE_AWAITING_GRANT: V_AWAITING };

// Grid draws one block of cell×cell device pixels per bucket into one
// ImageData, from a colour table precomputed per (owner, variant); a
// repaint rewrites only the blocks whose key changed.
class Grid {
  constructor(canvas) {
    this.canvas = canvas;
    this.ctx = canvas.getContext('2d');
    this.n = 0;
  }
  layout(n) {
    const dpr = window.devicePixelRatio || 1;
    const cols = Math.ceil(Math.sqrt(n));
    const rows = Math.ceil(n / cols);
    const cssMax = Math.max(256, Math.min(768, this.canvas.parentElement.clientWidth || 768));
    const cell = Math.max(1, Math.floor((cssMax * dpr) / cols));
    Object.assign(this, { n, cols, rows, cell, dpr });
    this.canvas.width = cols * cell;
    this.canvas.height = rows * cell;
    this.canvas.style.width = `${(cols * cell) / dpr}px`;
    this.canvas.style.height = `${(rows * cell) / dpr}px`;
    this.img = this.ctx.createImageData(this.canvas.width, this.canvas.height);
    this.px = new Uint32Array(this.img.data.buffer);
    this.keys = new Uint32Array(n); // 0: no colour drawn (every colour is opaque)
  }
  // colours builds the table: key = owner*4 + variant, owner 0 = none.
  colours(memberIds) {
    const t = new Uint32Array((memberIds.length + 1) * 4);
    const mark = [0, 0, 0];
    const fill = (i, rgb) => {
      const dark = rgb.map((c) => Math.round(c * 0.45));
      const pale = rgb.map((c) => Math.round(c + (255 - c) * 0.6));
      t[i * 4 + V_PLAIN] = pack(rgb);
      t[i * 4 + V_RELEASING] = pack(dark);
      t[i * 4 + V_AWAITING] = pack(pale);
      t[i * 4 + 3] = pack(mark);
    };
    fill(0, UNASSIGNED_RGB);
    memberIds.forEach((id, i) => fill(i + 1, memberRGB(id)));
    this.table = t;
    this.markColour = pack([0, 0, 0]);
    this.paleMark = pack([255, 255, 255]);
  }
  // paint draws every bucket whose colour changed: the colour is the
  // key, so a new map (whose member indexes shift) redraws only the
  // buckets that moved.
  paint(owners, variants) {
    const { cols, cell, px, keys, table } = this;
    const w = this.canvas.width;
    let changed = 0;
    for (let b = 0; b < this.n; b++) {
      const v = variants ? variants[b] : 0;
      const c = table[owners[b] * 4 + v] ?? table[0];
      if (keys[b] === c) continue;
      keys[b] = c;
      changed++;
      const x0 = (b % cols) * cell, y0 = ((b / cols) | 0) * cell;
      const fillTo = cell >= 6 ? cell - 1 : cell; // big blocks keep a 1 px gap
      for (let dy = 0; dy < fillTo; dy++) {
        const row = (y0 + dy) * w + x0;
        px.fill(c, row, row + fillTo);
      }
      // releasing: a dark centre; awaiting grant: a white centre (when a
      // block is big enough to hold a mark besides its colour).
      if (v !== V_PLAIN && cell >= 3) {
        const m = v === V_RELEASING ? this.markColour : this.paleMark;
        const size = Math.max(1, (fillTo / 3) | 0), at = ((fillTo - size) / 2) | 0;
        for (let dy = 0; dy < size; dy++) {
          const row = (y0 + at + dy) * w + x0 + at;
          px.fill(m, row, row + size);
        }
      }
    }
    if (changed) this.ctx.putImageData(this.img, 0, 0);
    return changed;
  }
  bucketAt(ev) {
    const r = this.canvas.getBoundingClientRect();
    const x = ((ev.clientX - r.left) * this.canvas.width) / r.width;
    const y = ((ev.clientY - r.top) * this.canvas.height) / r.height;
    const col = Math.floor(x / this.cell), row = Math.floor(y / this.cell);
    if (col < 0 || col >= this.cols || row < 0) return -1;
    const b = row * this.cols + col;
    return b < this.n ? b : -1;
  }
}

window.__keyshardTimings = { render_ms: null, repaint_ms: null, buckets: 0, members: 0, repaints: 0 };

// ---- routing -----------------------------------------------------------------

let current = null;
function route() {
  current?.abort();
  const ctl = new AbortController();
  current = ctl;
  $('#tooltip').hidden = true;
  const [, kind = '', ...rest] = location.hash.replace(/^#/, '').split('/');
  const name = decodeURIComponent(rest.join('/'));
  view.__html = undefined;
  const crumbs = $('#crumbs');
  switch (kind) {
    case 'keyspace':
      setHTML(crumbs, html`<a href="#/">overview</a> / keyspace ${name}`);
      keyspaceView(name, ctl.signal);
      break;
    case 'hotkeys':
      setHTML(crumbs, html`<a href="#/">overview</a> / hot keys ${name}`);
      hotKeysView(name, ctl.signal);
      break;
    case 'pools':
      setHTML(crumbs, html`<a href="#/">overview</a> / tenant pool ${name}`);
      poolView(name, ctl.signal);
      break;
    default:
      setHTML(crumbs, html`overview`);
      overview(ctl.signal);
  }
}

// ---- overview ----------------------------------------------------------------

function overview(signal) {
  view.innerHTML = `<h1>Overview</h1>
    <section id="ov-cluster" class="cards"></section>
    <h2>Keyspaces</h2><div id="ov-keyspaces"></div>
    <h2>Hot-key pools</h2><div id="ov-hot"></div>
    <h2>Tenant pools</h2><div id="ov-tenants"></div>`;
  view.dataset.view = 'overview';
  let round = 0;
  loop(signal, 1000, async () => {
    const st = await soft(api('AdminService', 'Status', {}, signal));
    if (signal.aborted) return;
    if (st.err) {
      setHTML($('#ov-cluster'), errHTML(st.err));
      const ks = await soft(api('AdminService', 'ListKeyspaces', {}, signal));
      setHTML($('#ov-keyspaces'), ks.err ? errHTML(ks.err) : keyspaceTable((ks.v.keyspaces || []).map((k) => ({ keyspace: k }))));
    } else {
      renderCluster(st.v);
      setHTML($('#ov-keyspaces'), keyspaceTable(st.v.keyspaces || []));
    }
    if (round++ % 5 === 0) await overviewPools(signal);
  });
}

function renderCluster(st) {
  const replicas = st.replicas || [];
  const store = st.store;
  setHTML($('#ov-cluster'), html`
    <div class="panel" id="ov-replica"><div class="muted">answering replica</div><div class="mono" data-replica="${st.replica}">${st.replica || '—'}</div>
      <div class="muted">leader</div><div class="mono" data-leader="${st.leader}">${st.leader || 'none elected'}</div></div>
    ${replicas.length ? html`<div class="panel"><div class="muted">replicas</div><ul>${replicas.map((r) => html`<li class="mono">${r.id} <small>${r.url}</small> ${r.leader ? html`<span class="pill leader">leader</span>` : ''}</li>`)}</ul></div>` : ''}
    ${store ? html`<div class="panel" id="ov-store"><div class="muted">store</div>
      <div class="${store.healthy ? 'ok' : 'error'}">${store.healthy ? 'healthy' : `unhealthy: ${store.error || ''}`}</div>
      <div><small>${(store.endpoints || []).join(', ') || 'embedded'} · ${fmtBytes(store.dbSizeBytes)} · revision ${fmtInt(store.revision)} · read ${fmtMs(store.latency)}</small></div></div>` : ''}`);
}

function keyspaceTable(list) {
  if (!list.length) return html`<p class="muted">No keyspaces.</p>`;
  const hasDrain = list.some((k) => 'drainingMembers' in k || 'releasingBuckets' in k);
  return html`<table id="keyspaces"><thead><tr><th>keyspace</th><th class="num">buckets</th><th>mode</th><th class="num">epoch</th><th class="num">members</th>
    <th class="num">unassigned</th><th class="num">handoffs in flight</th>${hasDrain ? html`<th class="num">draining</th><th class="num">releasing</th>` : ''}<th class="num" title="active members the map gives no bucket yet: a join the leader holds back (rebalance gap)">waiting</th></tr></thead><tbody>
    ${list.map((k) => html`<tr data-keyspace="${k.keyspace?.name}"><td>${ksLink(k.keyspace?.name)}</td><td class="num">${fmtInt(k.keyspace?.buckets)}</td>
      <td>${enumName(k.keyspace?.mode, 'KEYSPACE_MODE_')}</td><td class="num">${k.epoch ?? '—'}</td><td class="num">${k.members ?? '—'}</td>
      <td class="num">${k.unassignedBuckets ?? (k.epoch ? 0 : '—')}</td><td class="num">${k.handoffsInFlight ?? (k.epoch ? 0 : '—')}</td>
      ${hasDrain ? html`<td class="num">${k.drainingMembers || 0}</td><td class="num">${k.releasingBuckets || 0}</td>` : ''}<td class="num">${k.membersWithoutBuckets || 0}</td></tr>`)}
    </tbody></table>`;
}

async function overviewPools(signal) {
  const hot = await soft(api('AdminService', 'ListHotKeyPools', {}, signal));
  if (hot.err) setHTML($('#ov-hot'), errHTML(hot.err));
  else {
    const pools = hot.v.pools || [];
    const sizes = await Promise.all(pools.map((p) => soft(api('HotKeyService', 'GetOverflowSet', { pool: p.name }, signal))));
    setHTML($('#ov-hot'), pools.length ? html`<table id="hot-pools"><thead><tr><th>pool</th><th class="num">threshold</th><th class="num">keys in the overflow set</th><th class="num">version</th></tr></thead><tbody>
      ${pools.map((p, i) => html`<tr><td><a href="#/hotkeys/${encodeURIComponent(p.name)}">${p.name}</a></td><td class="num">${fmtRate(p.threshold)}/s</td>
        <td class="num">${sizes[i].err ? why(sizes[i].err) : (sizes[i].v.set?.keys || []).length}</td><td class="num">${sizes[i].v?.set?.version || 0}</td></tr>`)}</tbody></table>`
      : html`<p class="muted">No hot-key pools.</p>`);
  }
  const ten = await soft(api('TenantPoolService', 'ListTenantPools', {}, signal));
  if (ten.err) setHTML($('#ov-tenants'), errHTML(ten.err));
  else {
    const pools = ten.v.pools || [];
    setHTML($('#ov-tenants'), pools.length ? html`<table id="tenant-pools"><thead><tr><th>pool</th><th class="num">members</th><th class="num">tenants</th><th class="num">version</th><th>updated</th></tr></thead><tbody>
      ${pools.map((p) => html`<tr><td><a href="#/pools/${encodeURIComponent(p.pool?.name)}">${p.pool?.name}</a></td><td class="num">${p.members || 0}</td><td class="num">${p.tenants || 0}</td>
        <td class="num">${p.version || 0}</td><td>${fmtTime(p.updated)}</td></tr>`)}</tbody></table>`
      : html`<p class="muted">No tenant pools.</p>`);
  }
}

// ---- keyspace ----------------------------------------------------------------

function keyspaceView(name, signal) {
  view.innerHTML = String(html`<h1>Keyspace <span class="mono">${name}</span> <small id="ks-epoch"></small></h1>
    <div class="ks-layout">
      <div class="grid-wrap"><canvas id="grid" aria-label="buckets coloured by owner"></canvas><p id="grid-note" class="muted"></p></div>
      <aside><h2>Members in the map</h2><p id="state-counts" class="muted"></p><ul id="legend"></ul></aside>
    </div>
    <h2>Members</h2><p id="members-note" class="muted"></p><div id="members"></div>
    <h2>Epoch history</h2><div id="history"></div>`);
  view.dataset.view = 'keyspace';
  const ks = { name, map: null, owners: null, ids: [], members: null, membersErr: null, buckets: null, bucketsErr: null, variants: null };
  const grid = new Grid($('#grid'));
  ks.grid = grid;
  const canvas = $('#grid');
  const tip = $('#tooltip');
  canvas.addEventListener('mousemove', (ev) => {
    const b = grid.n ? grid.bucketAt(ev) : -1;
    if (b < 0) { tip.hidden = true; return; }
    tip.textContent = bucketInfo(ks, b);
    tip.hidden = false;
    tip.style.left = `${ev.clientX + 14}px`;
    tip.style.top = `${ev.clientY + 14}px`;
  });
  canvas.addEventListener('mouseleave', () => { tip.hidden = true; });
  $('#members').addEventListener('click', (ev) => {
    const btn = ev.target.closest('button[data-drain]');
    if (btn && !btn.disabled) openDrain(ks, btn.dataset.drain, signal);
  });
  ks.refresh = () => renderKeyspace(ks);

  // The map, by long poll: a new epoch repaints and refetches what it
  // changed (members, bucket states, history).
  let since = 0;
  loop(signal, 0, async () => {
    const got = await soft(api('MapService', 'GetMap', since ? { keyspace: name, sinceEpoch: String(since), wait: LONG_POLL } : { keyspace: name }, signal));
    if (signal.aborted) return;
    if (got.err) { $('#grid-note').textContent = `the map: ${why(got.err)}`; await sleep(3000, signal); return; }
    const r = got.v;
    if (!r.map) return;
    const epoch = num(r.map.epoch);
    if (since && epoch === since) return;
    since = epoch;
    onMap(ks, r.map);
    await Promise.all([loadMembers(ks, signal), loadBuckets(ks, signal), loadHistory(ks, signal)]);
    if (!signal.aborted) renderKeyspace(ks);
  });
  // Counts that change without an epoch (grants, releases, leases). The
  // bucket states too, every second while they are small; once they are
  // many runs (every bucket its own token: 65,536 runs are 6 MB of JSON)
  // every 10 s, and at every new epoch.
  let tick = 0;
  loop(signal, 1000, async () => {
    if (!ks.map) return;
    const big = (ks.buckets?.runs?.length || 0) > BIG_RUNS;
    await Promise.all([loadMembers(ks, signal), !big || ++tick % 10 === 0 ? loadBuckets(ks, signal) : null]);
    if (!signal.aborted) renderKeyspace(ks);
  });
}

function onMap(ks, m) {
  const t0 = performance.now();
  const n = num(m.buckets);
  const ids = (m.members || []).map((x) => x.id);
  const owners = Uint32Array.from(m.owners || []);
  const first = ks.grid.n !== n;
  if (first) ks.grid.layout(n);
  ks.grid.colours(ids);
  ks.map = m; ks.owners = owners; ks.ids = ids;
  if (ks.variants && ks.variants.length !== n) ks.variants = null;
  ks.grid.paint(owners, ks.variants);
  const ms = performance.now() - t0;
  const T = window.__keyshardTimings;
  if (first) T.render_ms = ms; else { T.repaint_ms = ms; T.repaints++; }
  T.buckets = n; T.members = ids.length;
  view.dataset.epoch = String(num(m.epoch));
}

async function loadMembers(ks, signal) {
  const r = await soft(api('AdminService', 'ListMembers', { keyspace: ks.name, leaseLeft: true }, signal));
  ks.members = r.v ? r.v.members || [] : null;
  ks.membersErr = r.err || null;
}

// BIG_RUNS is where GetBuckets stops being re-read every second.
const BIG_RUNS = 4096;

async function loadBuckets(ks, signal) {
  if (ks.bucketsErr?.code === 'unimplemented') return; // asked once
  const r = await soft(api('AdminService', 'GetBuckets', { keyspace: ks.name }, signal));
  ks.bucketsErr = r.err || null;
  ks.buckets = r.v || null;
  if (!r.v || !ks.map) return;
  const n = num(ks.map.buckets);
  const vs = new Uint8Array(n);
  for (const run of r.v.runs || []) {
    const v = STATE_VARIANT[run.state] || 0;
    if (v) vs.fill(v, num(run.first), Math.min(n, num(run.first) + num(run.count)));
  }
  ks.variants = vs;
}

async function loadHistory(ks, signal) {
  const r = await soft(api('AdminService', 'GetKeyspaceHistory', { keyspace: ks.name, limit: 50 }, signal));
  setHTML($('#history'), r.err ? errHTML(r.err) : historyTable(r.v.changes || []));
}

function runAt(runs, b) {
  let lo = 0, hi = runs.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1, r = runs[mid], f = num(r.first);
    if (b < f) hi = mid - 1; else if (b >= f + num(r.count)) lo = mid + 1; else return r;
  }
  return null;
}

function bucketInfo(ks, b) {
  const o = ks.owners?.[b] || 0;
  const lines = [`bucket ${b}`, `owner  ${o ? ks.ids[o - 1] : '(unassigned)'}`];
  const bk = ks.buckets;
  if (bk) {
    const r = runAt(bk.runs || [], b);
    if (r) {
      const mem = bk.members || [];
      lines.push(`state  ${enumName(r.state, 'BUCKET_STATE_')}`);
      lines.push(`holder ${num(r.holder) ? mem[num(r.holder) - 1] : '(none)'}`);
      lines.push(`token  ${num(r.token) ? r.token : '—'}`);
      if (bk.stream) lines.push(`position ${r.position || 0}`);
    }
  } else {
    lines.push(`(holder, token, position: ${ks.bucketsErr ? why(ks.bucketsErr) : 'loading'})`);
  }
  return lines.join('\n');
}

function renderKeyspace(ks) {
  const m = ks.map;
  if (!m) return;
  const counts = new Map();
  for (const o of ks.owners) counts.set(o, (counts.get(o) || 0) + 1);
  $('#ks-epoch').textContent = `epoch ${num(m.epoch)} · ${fmtInt(m.buckets)} buckets · ${ks.ids.length} members`;
  // States of buckets: from GetBuckets, or as counts from ListMembers.
  let releasing = 0, awaiting = 0, note;
  if (ks.buckets) {
    for (const r of ks.buckets.runs || []) {
      if (r.state === 'BUCKET_STATE_RELEASING') releasing += num(r.count);
      if (r.state === 'BUCKET_STATE_AWAITING_GRANT') awaiting += num(r.count);
    }
    note = 'dark centre: releasing (the old holder has not let go yet); pale with a white centre: awaiting grant; grey: unassigned. Hover a bucket for its holder and token.';
  } else if (ks.members) {
    for (const s of ks.members) {
      releasing += num(s.releasingBuckets);
      awaiting += Math.max(0, num(s.targetBuckets) - num(s.grantedBuckets));
    }
    note = `per-bucket states: ${ks.bucketsErr ? why(ks.bucketsErr) : 'loading'}; the counts come from the members' target and granted buckets. Grey: unassigned.`;
  } else note = 'grey: unassigned.';
  if (ks.variants) ks.grid.paint(ks.owners, ks.variants);
  const unassigned = counts.get(0) || 0;
  setHTML($('#state-counts'), html`<span data-releasing="${releasing}">${fmtInt(releasing)} releasing</span> · <span data-awaiting="${awaiting}">${fmtInt(awaiting)} awaiting grant</span> · <span data-unassigned="${unassigned}">${fmtInt(unassigned)} unassigned</span>`);
  $('#grid-note').textContent = note;
  setHTML($('#legend'), html`${ks.ids.map((id, i) => html`<li data-member="${id}" data-count="${counts.get(i + 1) || 0}"><span class="swatch" data-color="${css(memberRGB(id))}"></span><span class="mono">${id}</span><span class="count">${fmtInt(counts.get(i + 1) || 0)}</span></li>`)}
    ${unassigned ? html`<li data-member="" data-count="${unassigned}"><span class="swatch" data-color="${css(UNASSIGNED_RGB)}"></span><span class="muted">unassigned</span><span class="count">${fmtInt(unassigned)}</span></li>` : ''}`);
  renderMembers(ks, counts);
}

function renderMembers(ks, counts) {
  const ro = readOnly();
  let rows;
  if (ks.members) {
    $('#members-note').textContent = ro ? `Drain buttons are disabled: ${READ_ONLY_MSG}.` : '';
    rows = ks.members.map((s) => ({ ...s.member, leaseLeft: s.leaseLeft, target: s.targetBuckets || 0, granted: s.grantedBuckets || 0, releasing: s.releasingBuckets || 0, draining: s.draining }));
  } else {
    // Degraded: the map's members, with counts from the map.
    $('#members-note').textContent = `${ks.membersErr ? `member details are ${why(ks.membersErr)}` : 'loading'}; showing the map's members.${ro ? ` Drain buttons are disabled: ${READ_ONLY_MSG}.` : ''}`;
    rows = (ks.map.members || []).map((x, i) => ({ ...x, target: counts.get(i + 1) || 0 }));
  }
  const dash = (v) => (v === undefined ? '—' : fmtInt(v));
  setHTML($('#members'), html`<table id="members-table"><thead><tr><th>member</th><th>address</th><th class="num">weight</th><th>zone</th><th class="num">lease left</th>
    <th class="num">target</th><th class="num">granted</th><th class="num">releasing</th><th>draining</th><th></th></tr></thead><tbody>
    ${rows.map((r) => html`<tr data-member="${r.id}" data-draining="${r.draining ? 'true' : 'false'}">
      <td><span class="swatch" data-color="${css(memberRGB(r.id))}"></span> <span class="mono">${r.id}</span></td><td class="mono">${r.address}</td>
      <td class="num">${r.weight || 1}</td><td>${r.zone || ''}</td><td class="num">${r.leaseLeft !== undefined ? fmtDur(r.leaseLeft) : '—'}</td>
      <td class="num">${dash(r.target)}</td><td class="num">${dash(r.granted)}</td><td class="num">${dash(r.releasing)}</td>
      <td>${r.draining ? html`<span class="pill draining">draining</span>` : ''}</td>
      <td><button type="button" class="danger" data-drain="${r.id}" ${r.draining || ro ? new Raw('disabled') : ''} title="${ro ? READ_ONLY_MSG : 'move every bucket away from this member'}">Drain</button></td></tr>`)}
    </tbody></table>`);
}

function historyTable(changes) {
  if (!changes.length) return html`<p class="muted">No epoch changes recorded.</p>`;
  return html`<table id="history-table"><thead><tr><th class="num">epoch</th><th>time</th><th>reason</th><th>members</th><th class="num">moved</th><th>moves</th><th>detail</th></tr></thead><tbody>
    ${changes.map((c) => html`<tr data-epoch="${num(c.epoch)}"><td class="num">${num(c.epoch)}</td><td>${fmtTime(c.time)}</td><td>${enumName(c.reason, 'MOVE_REASON_')}</td>
      <td class="mono">${(c.members || []).join(', ')}</td><td class="num">${fmtInt(c.movedBuckets)}</td>
      <td class="mono">${(c.moves || []).map((mv) => `${mv.from || '(unassigned)'} → ${mv.to || '(unassigned)'}: ${num(mv.buckets)}`).join('; ')}</td><td>${c.detail || ''}</td></tr>`)}
    </tbody></table>`;
}

// ---- drain -------------------------------------------------------------------

let drainTarget = null;
function openDrain(ks, member, signal) {
  drainTarget = { ks, member, signal };
  $('#drain-text').textContent = `Drain ${member} of keyspace ${ks.name}? Its buckets move to the other members; it stays joined, holding nothing, until it leaves.`;
  $('#drain-error').hidden = true;
  $('#drain-confirm').disabled = false;
  $('#drain-dialog').showModal();
}
$('#drain-cancel').addEventListener('click', () => $('#drain-dialog').close());
$('#drain-confirm').addEventListener('click', async () => {
  if (!drainTarget) return;
  const { ks, member } = drainTarget;
  const err = $('#drain-error');
  $('#drain-confirm').disabled = true;
  try {
    await api('AdminService', 'DrainMember', { keyspace: ks.name, member });
    $('#drain-dialog').close();
    drainTarget = null;
    await loadMembers(ks, current?.signal);
    ks.refresh();
  } catch (e) {
    if (e.code === 'permission_denied') {
      // Remember the refusal for this token: the buttons stay disabled.
      sessionStorage.setItem(READONLY_KEY, token());
      showWho();
      err.textContent = `Refused: ${READ_ONLY_MSG}.`;
      ks.refresh();
    } else if (e.code === 'unauthenticated') {
      err.textContent = 'Refused: a token is needed (see the token form).';
    } else {
      err.textContent = `Drain failed: ${why(e)}`;
      $('#drain-confirm').disabled = false;
    }
    err.hidden = false;
  }
});

// ---- hot keys ----------------------------------------------------------------

function hotKeysView(pool, signal) {
  view.innerHTML = String(html`<h1>Hot keys of pool <span class="mono">${pool}</span> <small id="hk-version"></small></h1>
    <h2>Overflow set</h2><div id="overflow"></div><h2>Reports behind it</h2><div id="reports"></div>`);
  view.dataset.view = 'hotkeys';
  let since = 0;
  loop(signal, 0, async () => {
    const r = await soft(api('HotKeyService', 'GetOverflowSet', since ? { pool, sinceVersion: String(since), wait: LONG_POLL } : { pool }, signal));
    if (signal.aborted) return;
    if (r.err) { setHTML($('#overflow'), errHTML(r.err)); await sleep(5000, signal); return; }
    const set = r.v.set || {};
    since = Math.max(since, num(set.version));
    $('#hk-version').textContent = `version ${num(set.version)}`;
    const keys = set.keys || [];
    setHTML($('#overflow'), keys.length ? html`<table id="overflow-table"><thead><tr><th>key</th><th class="num">summed rate</th><th>since</th><th>cooling since</th></tr></thead><tbody>
      ${keys.map((k) => html`<tr data-key="${k.key}"><td class="mono">${k.key}</td><td class="num">${fmtRate(k.rate)}/s</td><td>${fmtTime(k.since)} <small>${fmtAgo(k.since)}</small></td>
        <td>${k.coolingSince ? html`${fmtTime(k.coolingSince)} <small>${fmtAgo(k.coolingSince)}</small>` : '—'}</td></tr>`)}</tbody></table>`
      : html`<p class="muted" id="overflow-empty">No key is hot.</p>`);
  });
  let reportsErr = null;
  loop(signal, 2000, async () => {
    if (reportsErr?.code === 'unimplemented') return;
    const r = await soft(api('AdminService', 'GetHotKeyReports', { pool }, signal));
    reportsErr = r.err || null;
    if (signal.aborted) return;
    if (r.err) { setHTML($('#reports'), errHTML(r.err)); return; }
    const reports = r.v.reports || [];
    setHTML($('#reports'), reports.length ? html`<table id="reports-table"><thead><tr><th>producer</th><th>reported</th><th>keys (rate)</th></tr></thead><tbody>
      ${reports.map((p) => html`<tr><td class="mono">${p.producer}</td><td>${fmtAgo(p.time)}</td>
        <td class="mono">${(p.keys || []).slice(0, 20).map((k) => `${k.key} ${fmtRate(k.rate)}/s`).join('; ')}${(p.keys || []).length > 20 ? ` … ${(p.keys || []).length - 20} more` : ''}</td></tr>`)}</tbody></table>`
      : html`<p class="muted">No current reports.</p>`);
  });
}

// ---- tenant pools --------------------------------------------------------------

function poolView(pool, signal) {
  view.innerHTML = String(html`<h1>Tenant pool <span class="mono">${pool}</span> <small id="tp-version"></small></h1>
    <h2>Members</h2><div id="tp-members"></div><h2>Tenants</h2><div id="tp-tenants"></div>`);
  view.dataset.view = 'pool';
  loop(signal, 2000, async () => {
    const [snap, ten] = await Promise.all([
      soft(api('TenantPoolService', 'GetPoolSnapshot', { pool }, signal)),
      soft(api('TenantPoolService', 'GetTenants', { pool, limit: 200 }, signal)),
    ]);
    if (signal.aborted) return;
    if (snap.err) setHTML($('#tp-members'), errHTML(snap.err));
    else {
      const s = snap.v.snapshot || {};
      $('#tp-version').textContent = `version ${num(s.version)}`;
      const sizes = new Map();
      for (const t of s.tenants || []) for (const p of t.members || []) sizes.set(p.member, (sizes.get(p.member) || 0) + 1);
      const ms = s.members || [];
      setHTML($('#tp-members'), ms.length ? html`<table id="tp-members-table"><thead><tr><th>member</th><th>address</th><th>zone</th><th class="num">weight</th><th class="num">tenants served</th></tr></thead><tbody>
        ${ms.map((m) => html`<tr><td class="mono">${m.id}</td><td class="mono">${m.address}</td><td>${m.zone || ''}</td><td class="num">${m.weight ?? 0}</td><td class="num">${sizes.get(m.id) || 0}</td></tr>`)}</tbody></table>`
        : html`<p class="muted">No members.</p>`);
    }
    if (ten.err) setHTML($('#tp-tenants'), errHTML(ten.err));
    else {
      const ts = ten.v.tenants || [];
      setHTML($('#tp-tenants'), ts.length ? html`<p class="muted">${fmtInt(ten.v.total)} tenants in the snapshot; the busiest ${ts.length}:</p><table id="tp-tenants-table"><thead><tr><th>tenant</th><th class="num">size</th><th class="num">rate</th><th>members</th><th>why</th></tr></thead><tbody>
        ${ts.map((t) => html`<tr><td class="mono">${t.assignment?.tenant}</td><td class="num">${t.assignment?.size || 0}</td><td class="num">${t.rateKnown ? `${fmtRate(t.rate)}/s` : '—'}</td>
          <td class="mono">${(t.assignment?.members || []).map((p) => p.member).join(', ')}</td><td>${t.assignment?.why || ''}</td></tr>`)}</tbody></table>`
        : html`<p class="muted">No tenants.</p>`);
    }
  });
}

// ---- start -------------------------------------------------------------------

window.addEventListener('hashchange', route);
showWho();
route();
