// DOM helpers. Text always goes in as text nodes: job bodies and errors
// are the tenants' data and must never be parsed as HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) { while (el.firstChild) el.firstChild.remove(); }

export function stateBadge(state) {
  return h('span', { class: `state s-${state || 'none'}` }, state || '—');
}

export function fmtNum(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  return Number(v).toLocaleString(undefined, { maximumFractionDigits: digits });
}

export function fmtTime(t) {
  if (!t) return '—';
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? String(t) : d.toLocaleString();
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return '—';
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

// field is a labelled form control.
export function field(label, control) {
  const id = control.id || ('f-' + Math.random().toString(36).slice(2, 9));
  control.id = id;
  return h('div', {}, h('label', { for: id }, label), control);
}

export function json(v) {
  return h('pre', { tabindex: 0 }, v === undefined || v === null ? '—' : JSON.stringify(v, null, 2));
}

export function table(headers, rows, opts = {}) {
  return h('div', { class: 'table-wrap' },
    h('table', { class: 'responsive', 'aria-label': opts.label },
      h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col', class: x.num ? 'num' : undefined }, x.label)))),
      h('tbody', {}, rows.map((cells) => h('tr', { 'data-key': cells.key },
        cells.map((c, i) => h('td', { 'data-label': headers[i].label, class: headers[i].num ? 'num' : undefined }, c)))))));
}

// goFiltered navigates to base with the filled inputs of keys as its
// query; datetime-local inputs go as RFC 3339.
export function goFiltered(base, inputs, keys) {
  const q = new URLSearchParams();
  for (const k of keys) {
    const v = inputs[k].value.trim();
    if (v) q.set(k, inputs[k].type === 'datetime-local' ? new Date(v).toISOString() : v);
  }
  location.hash = base + (q.toString() ? '?' + q : '');
}
