// Tenants and usage: GET /v1/usage by tenant and model over a chosen
// period, and (for an admin key) every tenant's back-pressure from
// GET /v1/status.
import { h, clear, fmtNum, field, table, stateBadge } from './dom.js';

export async function render({ root, query, api, session }) {
  const days = h('select', { name: 'days' }, [['1', 'last 24 hours'], ['7', 'last 7 days'], ['30', 'last 30 days']]
    .map(([v, l]) => h('option', { value: v, selected: query.get('days') === v }, l)));
  const form = h('form', { class: 'filters', 'aria-label': 'Usage period' }, field('Period', days), h('button', { type: 'submit', class: 'primary' }, 'Show'));
  form.addEventListener('submit', (ev) => { ev.preventDefault(); location.hash = `#/usage?days=${days.value}`; });
  const out = h('div', { id: 'usage' });
  const tenants = h('div', { id: 'tenants' });
  root.append(h('h1', {}, 'Tenants & usage'), form, out, tenants);

  const n = Number(query.get('days') || '1');
  const from = new Date(Date.now() - n * 86400e3).toISOString();
  const u = await api(`/v1/usage?group_by=tenant,model&from=${encodeURIComponent(from)}`);
  clear(out);
  out.append(h('h2', {}, 'Usage'), table(
    [{ label: 'Tenant' }, { label: 'Model' }, { label: 'Calls', num: true }, { label: 'Input tokens', num: true },
      { label: 'Output tokens', num: true }, { label: '429s', num: true }, { label: 'Failed', num: true }, { label: 'Cost', num: true }],
    [...(u.rows || []).map((r) => [r.tenant || '—', r.model || '—', fmtNum(r.calls, 0), fmtNum(r.input_tokens, 0), fmtNum(r.output_tokens, 0),
      fmtNum(r.rate_limited, 0), fmtNum(r.failed, 0), fmtNum(r.cost, 4)]),
    ['Total', '', fmtNum(u.totals.calls, 0), fmtNum(u.totals.input_tokens, 0), fmtNum(u.totals.output_tokens, 0),
      fmtNum(u.totals.rate_limited, 0), fmtNum(u.totals.failed, 0), fmtNum(u.totals.cost, 4)]], { label: 'Usage by tenant and model' }),
  u.unpriced_models && u.unpriced_models.length ? h('p', { class: 'muted' }, `No price configured for: ${u.unpriced_models.join(', ')}`) : null);

  const st = await api('/v1/status');
  const ts = st.tenants || {};
  tenants.append(h('h2', {}, session.admin ? 'Tenants' : `Tenant ${session.tenant}`), table(
    [{ label: 'Tenant' }, { label: 'State' }, { label: 'Backlog', num: true }, { label: 'Limit', num: true }, { label: 'Drain/s', num: true }],
    Object.keys(ts).sort().map((t) => [t, stateBadge(ts[t].state), fmtNum(ts[t].backlog, 0), ts[t].backlog_limit ? fmtNum(ts[t].backlog_limit, 0) : '—',
      fmtNum(ts[t].drain_rate, 2)]), { label: 'Tenants' }));
}
