// paygate dashboard: every provider's budget, one sample a second (the latest from /api/status, polled each
// second; the history from /api/history at start). No framework; the DOM is rebuilt from each sample.
// Polling rather than /api/events keeps no request open: proxies pass it, and headless tests can wait for
// the page to settle.
'use strict';

const keep = 120; // samples the charts show (two minutes)
const samples = [];
const root = document.getElementById('providers');
const state = document.getElementById('state');

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
}

function add(s) {
  samples.push(s);
  if (samples.length > keep) samples.shift();
}

// limitOf is the number of "100/1s".
function limitOf(spec) { return parseInt(String(spec).split('/')[0], 10) || 1; }

// chart draws one policy's use (solid) and use plus reservations (dashed) over the kept samples.
function chart(provider, i, limit) {
  const w = 220, h = 40;
  const pts = (f) => samples.map((s, k) => {
    const p = (s.providers || []).find(e => e.provider === provider);
    const pol = p && p.policies && p.policies[i];
    const v = pol ? f(pol) : 0;
    const x = samples.length < 2 ? w : (k * w) / (keep - 1);
    return x.toFixed(1) + ',' + (h - Math.min(1, v / limit) * h).toFixed(1);
  }).join(' ');
  return `<svg width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" aria-label="use of ${esc(provider)} policy ${i}">` +
    `<line x1="0" y1="0.5" x2="${w}" y2="0.5" stroke="#b3261e" stroke-width="1"/>` +
    `<polyline fill="none" stroke="#8aa4c8" stroke-dasharray="3 2" points="${pts(p => p.used + p.reserved)}"/>` +
    `<polyline fill="none" stroke="#1f5fae" stroke-width="1.5" points="${pts(p => p.used)}"/></svg>`;
}

function card(p) {
  const meta = [esc(p.algorithm || ''), 'limits: ' + esc(p.limits_source || 'config')];
  if (p.paused_until) meta.push(`<span class="paused" data-paused="1">paused until ${esc(p.paused_until)}</span>`);
  if (p.breaker) meta.push(breaker(p.breaker));
  meta.push(`margin ${Number(p.margin_ms || 0).toFixed(0)} ms (${esc(p.margin_why || '')})`);
  if (p.max_in_flight > 0) meta.push(`in flight <span class="in-flight">${p.in_flight}</span> of ${p.max_in_flight}`);
  if (p.queued !== undefined) {
    const c = p.queued_by_class || {};
    const by = (c.high || c.low) ? ` (high <span class="queued-high">${c.high || 0}</span>, normal ${c.normal || 0}, low <span class="queued-low">${c.low || 0}</span>)` : '';
    meta.push(`queued <span class="queued">${p.queued}</span>${by}`);
  }
  else if (p.backlog_error) meta.push(`queued ? <span class="error">${esc(p.backlog_error)}</span>`);
  let rows = '';
  (p.policies || []).forEach((pol, i) => {
    rows += `<tr data-policy="${i}"><td class="limit">${esc(pol.limit)}</td><td class="used">${pol.used}</td>` +
      `<td class="reserved">${pol.reserved}</td><td class="remaining">${pol.remaining}</td>` +
      `<td>${pol.reset_after_ms} ms</td><td>${chart(p.provider, i, limitOf(pol.limit))}</td></tr>`;
  });
  let merchants = '';
  if (p.merchants) {
    const top = (p.merchants.top || []).map(m => `${esc(m.merchant)} ${m.used}${m.limit ? '/' + esc(m.limit) : ''}`).join(', ');
    merchants = `<div class="merchants">merchants seen: ${p.merchants.seen}${top ? '; top: ' + top : ''}</div>`;
  }
  const err = p.error ? `<div class="error">${esc(p.error)}</div>` : '';
  const ev = events(p.events || []);
  return `<article class="provider" data-provider="${esc(p.provider)}"><h2>${esc(p.provider)}</h2>` +
    `<div class="meta">${meta.join(' · ')}</div>${err}` +
    `<table><tr><th>limit</th><th>used</th><th>reserved</th><th>remaining</th><th>reset in</th><th>last ${keep} s</th></tr>${rows}</table>` +
    `${ev}${merchants}</article>`;
}

// breaker is the provider's circuit breaker (providers.<name>.breaker): closed with its run of failures,
// open until its probe, or probing (one request let through).
function breaker(b) {
  const st = esc(b.state);
  if (b.state === 'off' || b.state === 'closed') {
    const run = b.state === 'closed' ? ` (${b.failures} of ${b.threshold} failures)` : '';
    return `<span class="breaker" data-breaker="${st}">breaker ${st}${run}</span>`;
  }
  const when = b.state === 'open' ? 'probe at ' + esc(b.probe_at) : 'probe answer due by ' + esc(b.probe_by);
  return `<span class="breaker open" data-breaker="${st}">breaker ${st}: nothing sent; ${when};` +
    ` open for ${(Number(b.open_for_ms || 0) / 1000).toFixed(1)} s</span>`;
}

// events is a provider's 429s per minute (the last whole minute, and this one so far) and its dead letters
// by reason over the minutes the sample carries, as every worker counted them.
function events(minutes) {
  if (!minutes.length) return '';
  const now = minutes[minutes.length - 1], prev = minutes.length > 1 ? minutes[minutes.length - 2] : {throttled: 0};
  const dead = {};
  minutes.forEach(m => Object.entries(m.dead || {}).forEach(([r, n]) => { dead[r] = (dead[r] || 0) + n; }));
  const reasons = Object.keys(dead).sort().map(r => `<span data-reason="${esc(r)}">${esc(r)} ${dead[r]}</span>`).join(', ');
  return `<div class="events">429s per minute: <span class="throttled">${prev.throttled}</span> (this minute ${now.throttled})` +
    ` · dead letters in the last ${minutes.length} min: <span class="dead">${reasons || 'none'}</span></div>`;
}

function render() {
  const last = samples[samples.length - 1];
  if (!last) return;
  const t0 = performance.now();
  state.textContent = 'at ' + last.at;
  state.dataset.at = last.at;
  root.innerHTML = (last.providers || []).map(card).join('');
  state.dataset.renderMs = (performance.now() - t0).toFixed(1); // what a sample costs the browser
}

async function start() {
  try {
    const h = await (await fetch('api/history')).json();
    (h || []).slice(-keep).forEach(add);
    render();
  } catch (e) {
    state.textContent = 'no history: ' + e;
  }
  poll();
}

async function poll() {
  try {
    const s = await (await fetch('api/status', {cache: 'no-store'})).json();
    const last = samples[samples.length - 1];
    if (s.at && (!last || last.at !== s.at)) {
      add(s);
      render();
    }
  } catch (e) {
    state.textContent = 'reconnecting… (' + e + ')';
  }
  setTimeout(poll, 1000);
}

start();
