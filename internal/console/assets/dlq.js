// Dead letters: reason, original body, replay one or the filtered set,
// each after a confirmation. The filtered replay uses POST /v1/dlq/replay
// (with dry_run=true first, for the count) where the server has it, and
// otherwise replays the listed page's dead letters one by one.
import { h, clear, fmtTime, field, json, goFiltered } from './dom.js';
import { confirmDialog, APIError } from './app.js';

const FILTERS = ['tenant', 'reason', 'model', 'failed_after', 'failed_before'];

export async function render({ root, query, api, session }) {
  const inputs = {
    tenant: h('input', { name: 'tenant', placeholder: session.admin ? 'default (* for all)' : session.tenant, disabled: !session.admin }),
    reason: h('input', { name: 'reason', placeholder: 'any' }),
    model: h('input', { name: 'model', placeholder: 'any' }),
    failed_after: h('input', { name: 'failed_after', type: 'datetime-local' }),
    failed_before: h('input', { name: 'failed_before', type: 'datetime-local' }),
  };
  for (const k of FILTERS) if (query.get(k) && !k.startsWith('failed_')) inputs[k].value = query.get(k);
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter dead letters' },
    field('Tenant', inputs.tenant), field('Reason', inputs.reason), field('Model', inputs.model),
    field('Failed after', inputs.failed_after), field('Failed before', inputs.failed_before),
    h('button', { type: 'submit', class: 'primary' }, 'Apply'));
  form.addEventListener('submit', (ev) => { ev.preventDefault(); goFiltered('#/dlq', inputs, FILTERS); });
  const note = h('p', { id: 'dlq-note', role: 'status' });
  const list = h('div', { id: 'dlq-list' });
  const replayAll = h('button', { type: 'button', class: 'danger', id: 'dlq-replay-all' }, 'Replay all that match…');
  const pager = h('div', { class: 'pager' });
  root.append(h('h1', {}, 'Dead letters'), form, h('p', {}, replayAll), note, list, pager);

  const filterQuery = () => {
    const q = new URLSearchParams();
    for (const k of FILTERS) if (query.get(k)) q.set(k, query.get(k));
    return q;
  };
  const cursors = [''];
  let page = 0;
  let shown = [];
  const load = async () => {
    const q = filterQuery();
    q.set('limit', '50');
    if (cursors[page]) q.set('cursor', cursors[page]);
    const res = await api('/v1/dlq?' + q);
    shown = res.dead_letters || [];
    cursors[page + 1] = res.next_cursor || '';
    draw(list, shown, replayOne);
    clear(pager);
    pager.append(
      h('button', { type: 'button', disabled: page === 0, onclick: () => { page--; load(); } }, '← Previous'),
      h('button', { type: 'button', disabled: !res.next_cursor, onclick: () => { page++; load(); } }, 'Next →'));
  };
  const tenantQ = (dl) => (dl.tenant ? `?tenant=${encodeURIComponent(dl.tenant)}` : (query.get('tenant') && query.get('tenant') !== '*' ? `?tenant=${encodeURIComponent(query.get('tenant'))}` : ''));
  async function replayOne(dl) {
    if (!(await confirmDialog(`Replay dead letter ${dl.id}${dl.job_id ? ' (job ' + dl.job_id + ')' : ''}? The job runs again.`, 'Replay'))) return;
    try {
      const r = await api(`/v1/dlq/${dl.id}/replay${tenantQ(dl)}`, { method: 'POST' });
      note.textContent = `Replayed dead letter ${dl.id}${r.job_id ? ': job ' + r.job_id + ' is ' + r.status : ''}.`;
    } catch (e) { note.textContent = `Replay of ${dl.id} refused: ${e.message}`; }
    await load();
  }
  replayAll.addEventListener('click', async () => {
    const q = filterQuery();
    let count = shown.length;
    let bulk = true;
    try {
      const dry = await api(`/v1/dlq/replay?${q}&dry_run=true`, { method: 'POST' });
      count = dry.matched;
    } catch (e) {
      if (!(e instanceof APIError) || (e.status !== 404 && e.status !== 405)) { note.textContent = e.message; return; }
      bulk = false; // an older server: replay what this page lists
    }
    if (!count) { note.textContent = 'Nothing matches.'; return; }
    if (!(await confirmDialog(`Replay ${count} dead letter(s) that match these filters? Their jobs run again.`, `Replay ${count}`))) return;
    let ok = 0, failed = 0;
    if (bulk) {
      const r = await api(`/v1/dlq/replay?${q}`, { method: 'POST' });
      ok = (r.replayed || []).length; failed = (r.failed || []).length;
    } else {
      for (const dl of shown) {
        try { await api(`/v1/dlq/${dl.id}/replay${tenantQ(dl)}`, { method: 'POST' }); ok++; } catch { failed++; }
      }
    }
    note.textContent = `Replayed ${ok}${failed ? `, ${failed} refused` : ''}.`;
    await load();
  });
  await load();
}

function draw(list, dls, replayOne) {
  clear(list);
  if (!dls.length) { list.append(h('p', { class: 'muted' }, 'No dead letters match.')); return; }
  for (const dl of dls) {
    list.append(h('article', { class: 'card', 'data-dlq': dl.id, 'aria-labelledby': `dl-${dl.id}` },
      h('h3', { id: `dl-${dl.id}` }, `#${dl.id} `, dl.job_id ? h('a', { href: `#/jobs/${encodeURIComponent(dl.job_id)}${dl.tenant ? '?tenant=' + encodeURIComponent(dl.tenant) : ''}` }, dl.job_id) : '(no job id)'),
      h('p', {}, h('strong', {}, dl.reason), ` · lane ${dl.lane} · ${dl.attempts} attempt(s) · last failed ${fmtTime(dl.last_failed_at)}`),
      dl.last_error ? h('p', { class: 'error' }, dl.last_error) : null,
      h('details', {}, h('summary', {}, 'Original body'), json(dl.body !== undefined ? dl.body : dl.body_base64)),
      h('p', {}, h('button', { type: 'button', class: 'dlq-replay', onclick: () => replayOne(dl) }, `Replay #${dl.id}`))));
  }
}
