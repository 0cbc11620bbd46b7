// Job detail: the document, the request as submitted, the usage, the
// attempts timeline (attempt_log, when the server records it), the
// webhook delivery, and Cancel. A job that is not finished is watched with
// the API's long-poll (GET /v1/jobs/{id}?wait=), which answers when it
// finishes: no polling.
import { h, clear, stateBadge, fmtTime, fmtNum, json } from './dom.js';
import { confirmDialog } from './app.js';

const TERMINAL = new Set(['succeeded', 'failed', 'dead', 'cancelled']);

export async function render({ root, param, query, api }) {
  const id = param;
  const tq = query.get('tenant') ? `tenant=${encodeURIComponent(query.get('tenant'))}` : '';
  const path = `/v1/jobs/${encodeURIComponent(id)}`;
  const ctl = new AbortController();
  const body = h('div', {});
  const note = h('p', { id: 'job-note', role: 'status' });
  root.append(h('p', {}, h('a', { href: '#/jobs' }, '← Jobs')), h('h1', {}, 'Job ', h('code', {}, id)), note, body);

  let doc;
  try {
    doc = await api(`${path}?${tq}`, { signal: ctl.signal });
  } catch (e) {
    if (e.status === 404) { body.append(h('p', { class: 'error', id: 'job-missing', role: 'alert' }, 'No such job.')); return; }
    throw e;
  }
  let req = null;
  try { req = await api(`${path}/request?${tq}`, { signal: ctl.signal }); } catch { req = null; }

  const draw = (d) => {
    clear(body);
    const cancel = h('button', { type: 'button', class: 'danger', id: 'job-cancel', disabled: TERMINAL.has(d.status) }, 'Cancel job');
    cancel.addEventListener('click', async () => {
      if (!(await confirmDialog(`Cancel job ${d.id}? A running call is stopped; a finished job cannot be cancelled.`, 'Cancel job'))) return;
      try {
        draw(await api(`${path}/cancel?${tq}`, { method: 'POST' }));
        note.textContent = 'Cancelled.';
      } catch (e) { note.textContent = `Cancel refused: ${e.message}`; }
    });
    body.append(
      h('div', { class: 'cards' },
        card('Status', h('span', { id: 'job-status' }, stateBadge(d.status))),
        card('Tenant', d.tenant), card('Model', d.model_used && d.model_used !== d.model ? `${d.model} → ${d.model_used}` : d.model),
        card('Lane', d.priority), card('Attempts', String(d.attempts)),
        card('Created', fmtTime(d.created_at)), card('Started', fmtTime(d.started_at)), card('Completed', fmtTime(d.completed_at)),
        d.expected_start_at ? card('Expected start', fmtTime(d.expected_start_at)) : null),
      h('p', {}, cancel),
      h('div', { class: 'detail' },
        h('section', { 'aria-labelledby': 'job-req' }, h('h2', { id: 'job-req' }, 'Request'), json(req ? req.request : undefined)),
        h('section', { 'aria-labelledby': 'job-resp' }, h('h2', { id: 'job-resp' }, 'Response'),
          d.error ? h('p', { class: 'error' }, `${d.error.kind}${d.error.code ? ' (' + d.error.code + ')' : ''}: ${d.error.message}`) : null,
          json(d.response)),
        h('section', { 'aria-labelledby': 'job-usage' }, h('h2', { id: 'job-usage' }, 'Usage'),
          d.usage ? h('p', {}, `${fmtNum(d.usage.prompt_tokens, 0)} prompt + ${fmtNum(d.usage.completion_tokens, 0)} completion = ${fmtNum(d.usage.total_tokens, 0)} tokens`) : h('p', { class: 'muted' }, 'None yet.'),
          d.metadata ? [h('h3', {}, 'Metadata'), json(d.metadata)] : null),
        h('section', { 'aria-labelledby': 'job-attempts' }, h('h2', { id: 'job-attempts' }, 'Attempts'), timeline(d)),
        h('section', { 'aria-labelledby': 'job-hook' }, h('h2', { id: 'job-hook' }, 'Result deliveries'), deliveries(d))));
  };
  draw(doc);

  // Watch an unfinished job through the long-poll until it finishes.
  (async () => {
    while (!ctl.signal.aborted && !TERMINAL.has(doc.status)) {
      try {
        doc = await api(`${path}?wait=25s${tq ? '&' + tq : ''}`, { signal: ctl.signal });
        draw(doc);
      } catch (e) {
        if (ctl.signal.aborted) return;
        await new Promise((r) => setTimeout(r, 2000));
      }
    }
  })();
  return () => ctl.abort();
}

function card(k, v) {
  return h('div', { class: 'card' }, h('div', { class: 'k' }, k), h('div', { class: 'v' }, v));
}

// timeline shows attempt_log when the server keeps one; otherwise the
// last error is all there is.
function timeline(d) {
  const log = d.attempt_log;
  if (!Array.isArray(log)) {
    return h('p', { class: 'muted' }, d.error ? `Last failed attempt ${d.error.attempt} at ${fmtTime(d.error.at)}.` : 'This server records no attempt timeline.');
  }
  if (!log.length) return h('p', { class: 'muted' }, 'No attempt yet.');
  return h('ol', { class: 'timeline', id: 'job-timeline' }, log.map((a) => h('li', { class: a.outcome === 'succeeded' ? 'ok' : 'bad' },
    h('strong', {}, `#${a.attempt} ${a.outcome}`), a.model ? ` on ${a.model}` : '',
    a.http_status ? ` · HTTP ${a.http_status}` : '', a.kind && a.kind !== a.outcome ? ` · ${a.kind}` : '',
    h('div', { class: 'muted' },
      `waited ${fmtMs(a.wait_ms)}`, a.admission_wait_ms !== undefined ? ` (admission ${fmtMs(a.admission_wait_ms)})` : '',
      a.duration_ms !== undefined ? ` · call ${fmtMs(a.duration_ms)}` : '', ` · ended ${fmtTime(a.ended_at)}`,
      a.prompt_tokens ? ` · ${a.prompt_tokens}+${a.completion_tokens || 0} tokens` : ''),
    a.message ? h('div', {}, a.code ? `${a.code}: ${a.message}` : a.message) : null)));
}

function deliveries(d) {
  if (!d.webhook) return h('p', { class: 'muted' }, 'No webhook delivery for this job.');
  const w = d.webhook;
  return h('p', {}, `Webhook ${w.status} after ${w.attempts} attempt(s)`,
    w.last_error ? ` · last error: ${w.last_error}` : '', w.next_attempt_at ? ` · next try ${fmtTime(w.next_attempt_at)}` : '');
}

function fmtMs(ms) {
  if (ms === undefined || ms === null) return '—';
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}
