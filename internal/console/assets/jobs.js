// Jobs: the list with its filters, find by id, cursor paging. While the
// page is open and the tab visible, the current page is read again every
// two seconds (one request), so a job's status moves without a reload.
import { h, clear, stateBadge, fmtTime, field, table, goFiltered } from './dom.js';

const STATUSES = ['', 'queued', 'running', 'retrying', 'batched', 'succeeded', 'failed', 'dead', 'cancelled'];
// FILTERS are the query parameters of GET /v1/jobs the form sets; a
// server that does not know one ignores it.
const FILTERS = ['status', 'tenant', 'model', 'meta', 'created_after', 'created_before'];
const REFRESH_MS = 2000;

export async function render({ root, query, api, session }) {
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter jobs' });
  const inputs = {
    status: h('select', { name: 'status' }, STATUSES.map((s) => h('option', { value: s }, s || 'any'))),
    tenant: h('input', { name: 'tenant', placeholder: session.admin ? 'default (* for all)' : session.tenant, disabled: !session.admin }),
    model: h('input', { name: 'model', placeholder: 'any' }),
    meta: h('input', { name: 'meta', placeholder: 'key:value' }),
    created_after: h('input', { name: 'created_after', type: 'datetime-local' }),
    created_before: h('input', { name: 'created_before', type: 'datetime-local' }),
  };
  for (const k of FILTERS) if (query.get(k)) inputs[k].value = k.startsWith('created_') ? toLocal(query.get(k)) : query.get(k);
  form.append(
    field('Status', inputs.status), field('Tenant', inputs.tenant), field('Model', inputs.model),
    field('Metadata', inputs.meta), field('Created after', inputs.created_after), field('Created before', inputs.created_before),
    h('button', { type: 'submit', class: 'primary' }, 'Apply'));
  form.addEventListener('submit', (ev) => { ev.preventDefault(); goFiltered('#/jobs', inputs, FILTERS); });

  const findId = h('input', { name: 'id', placeholder: 'job id', autocomplete: 'off' });
  const find = h('form', { class: 'filters', role: 'search', 'aria-label': 'Find a job by id' },
    field('Find by id', findId), h('button', { type: 'submit' }, 'Open'));
  find.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const id = findId.value.trim();
    if (!id) return;
    const t = inputs.tenant.value.trim();
    location.hash = `#/jobs/${encodeURIComponent(id)}` + (session.admin && t && t !== '*' ? `?tenant=${encodeURIComponent(t)}` : '');
  });

  const list = h('div', { id: 'jobs-list', 'aria-live': 'polite' });
  const pager = h('div', { class: 'pager' });
  root.append(h('h1', {}, 'Jobs'), form, find, list, pager);

  const cursors = [''];
  let page = 0;
  let timer = null;
  const params = () => {
    const q = new URLSearchParams({ limit: '50', order: 'desc' });
    for (const k of FILTERS) if (query.get(k)) q.set(k, query.get(k));
    if (cursors[page]) q.set('cursor', cursors[page]);
    return q;
  };
  const load = async () => {
    const res = await api('/v1/jobs?' + params());
    draw(list, res.jobs || []);
    cursors[page + 1] = res.next_cursor || '';
    clear(pager);
    pager.append(
      h('button', { type: 'button', disabled: page === 0, onclick: () => { page--; load(); } }, '← Previous'),
      h('button', { type: 'button', disabled: !res.next_cursor, onclick: () => { page++; load(); } }, 'Next →'));
  };
  await load();
  const tick = async () => {
    if (!document.hidden) { try { await load(); } catch { /* shown on the next success */ } }
    timer = setTimeout(tick, REFRESH_MS);
  };
  timer = setTimeout(tick, REFRESH_MS);
  return () => clearTimeout(timer);
}

function draw(list, jobs) {
  // Redraw only on a change, so a refresh does not take the keyboard focus away.
  const sig = JSON.stringify(jobs.map((j) => [j.tenant, j.id, j.status, j.attempts, j.model_used]));
  if (list.dataset.sig === sig) return;
  list.dataset.sig = sig;
  clear(list);
  if (!jobs.length) { list.append(h('p', { class: 'muted' }, 'No jobs match.')); return; }
  const rows = jobs.map((j) => {
    const href = `#/jobs/${encodeURIComponent(j.id)}?tenant=${encodeURIComponent(j.tenant)}`;
    const cells = [h('a', { href, class: 'job-link', 'data-job': j.id }, j.id), j.tenant,
      h('span', { 'data-status-of': j.id }, stateBadge(j.status)), j.model_used || j.model, j.priority, String(j.attempts), fmtTime(j.created_at)];
    cells.key = j.id;
    return cells;
  });
  list.append(table([{ label: 'Id' }, { label: 'Tenant' }, { label: 'Status' }, { label: 'Model' }, { label: 'Lane' },
    { label: 'Attempts', num: true }, { label: 'Created' }], rows, { label: 'Jobs' }));
}

function toLocal(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}
