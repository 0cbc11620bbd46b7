// A small SVG line chart of one series against its limit: enough for
// "admitted per second over the last 15 minutes", no library needed.
const NS = 'http://www.w3.org/2000/svg';

function el(tag, attrs) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// lineChart draws values (one a second at times t, Unix seconds) with a
// dashed limit line and a tick at every second with 429s.
export function lineChart({ t, values, limit, limited, cls, label }) {
  const W = 600, H = 140, L = 44, R = 6, T = 8, B = 18;
  const svg = el('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': label });
  const now = t.length ? t[t.length - 1] : Math.floor(Date.now() / 1000);
  const from = now - 15 * 60;
  const top = Math.max(limit || 0, ...values, 1) * 1.1;
  const x = (s) => L + ((s - from) / (15 * 60)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  for (const f of [0, 0.5, 1]) {
    svg.append(el('line', { class: 'grid', x1: L, x2: W - R, y1: y(top * f), y2: y(top * f) }));
    const txt = el('text', { x: L - 4, y: y(top * f) + 4, 'text-anchor': 'end' });
    txt.textContent = fmt(top * f);
    svg.append(txt);
  }
  for (const [m, s] of [[15, from], [0, now]]) {
    const txt = el('text', { x: x(s), y: H - 4, 'text-anchor': m ? 'start' : 'end' });
    txt.textContent = m ? '−15 min' : 'now';
    svg.append(txt);
  }
  if (limit) svg.append(el('line', { class: 'lim', x1: L, x2: W - R, y1: y(limit), y2: y(limit) }));
  const pts = [];
  for (let i = 0; i < t.length; i++) if (t[i] >= from) pts.push(`${x(t[i]).toFixed(1)},${y(values[i]).toFixed(1)}`);
  if (pts.length) svg.append(el('polyline', { class: cls, points: pts.join(' ') }));
  if (limited) {
    for (let i = 0; i < t.length; i++) {
      if (limited[i] > 0 && t[i] >= from) svg.append(el('rect', { class: 'r429', x: x(t[i]) - 1, y: H - B - 6, width: 2, height: 6 }));
    }
  }
  const title = el('title', {});
  title.textContent = label;
  svg.prepend(title);
  return svg;
}

function fmt(v) {
  if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + 'k';
  return v >= 10 ? v.toFixed(0) : v.toFixed(1);
}
