// Overview: the back-pressure status and, for an admin key, every model
// as the live consumer replicas report it. One EventSource-like stream
// (GET /v1/overview/stream) pushes the document every second; fetch is
// used rather than EventSource because EventSource cannot send the
// Authorization header.
import { h, clear, stateBadge, fmtNum, fmtSeconds, table } from './dom.js';
import { lineChart } from './chart.js';

export async function render({ root, session }) {
  const status = h('section', { 'aria-labelledby': 'ov-lanes' });
  const models = h('section', { 'aria-labelledby': 'ov-models' });
  const live = h('p', { class: 'muted', id: 'ov-live', 'aria-live': 'off' }, 'Connecting…');
  root.append(h('h1', {}, 'Overview'), live, status, models);
  const ctl = new AbortController();
  stream(ctl.signal, (o) => {
    live.textContent = `Live · updated ${new Date(o.updated_at).toLocaleTimeString()}`;
    drawStatus(status, o.status);
    drawModels(models, o.models, session);
  }, (err) => { live.textContent = `Stream interrupted (${err}); reconnecting…`; });
  return () => ctl.abort();
}

// stream reads server-sent events from the overview stream, reconnecting
// after a second when it breaks, until signal aborts.
async function stream(signal, onEvent, onError) {
  while (!signal.aborted) {
    try {
      const res = await fetch('/v1/overview/stream', {
        headers: { Authorization: 'Bearer ' + (sessionStorage.getItem('llmq.key') || ''), Accept: 'text/event-stream' },
        signal,
      });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = block.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
          if (data) onEvent(JSON.parse(data));
        }
      }
      throw new Error('closed');
    } catch (e) {
      if (signal.aborted) return;
      onError(e.message || e);
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}

function drawStatus(el, st) {
  clear(el);
  const lanes = ['high', 'normal', 'low'];
  el.append(
    h('h2', { id: 'ov-lanes' }, st.tenant ? `Backlog of tenant ${st.tenant}` : 'Backlog'),
    h('div', { class: 'cards' },
      card('State', stateBadge(st.state), 'ov-state'),
      card('Backlog', fmtNum(st.total, 0), 'ov-total'),
      ...lanes.map((l) => card(`Lane ${l}`, fmtNum((st.backlog || {})[l] || 0, 0), `ov-lane-${l}`)),
      card('Drain rate', `${fmtNum(st.drain_rate, 2)} jobs/s`, 'ov-drain'),
      card('Time to drain', st.eta_seconds === null ? 'not draining' : fmtSeconds(st.eta_seconds), 'ov-eta'),
      card('Soft / hard limit', `${fmtNum(st.soft_limit, 0)} / ${fmtNum(st.hard_limit, 0)}`)));
}

function card(k, v, id) {
  return h('div', { class: 'card', id }, h('div', { class: 'k' }, k), h('div', { class: 'v' }, v));
}

function drawModels(el, models, session) {
  clear(el);
  el.append(h('h2', { id: 'ov-models' }, 'Models'));
  if (!session.admin) {
    el.append(h('p', { class: 'muted' }, 'A model\'s load is every tenant\'s together: an admin key shows it.'));
    return;
  }
  if (!models.length) {
    el.append(h('p', { class: 'muted' }, 'No consumer replica is reporting (replica snapshots are written every second by each running consumer).'));
    return;
  }
  el.append(h('div', { class: 'models' }, models.map(model)));
}

function model(m) {
  const s = m.series;
  const rpsLimit = m.rpm_limit / 60, tpsLimit = m.tpm_limit / 60;
  return h('article', { class: 'model', 'aria-labelledby': `m-${m.model}`, 'data-model': m.model },
    h('h3', { id: `m-${m.model}` }, m.model, ' ', stateBadge(m.controller_state)),
    h('dl', {},
      dd('Requests/s', `${fmtNum(m.requests_per_sec, 2)}${rpsLimit ? ' of ' + fmtNum(rpsLimit, 2) : ''}`),
      dd('Tokens/s', `${fmtNum(m.tokens_per_sec, 0)}${tpsLimit ? ' of ' + fmtNum(tpsLimit, 0) : ''}`),
      dd('429s/s (total)', `${fmtNum(m.rate_limited_per_sec, 2)} (${fmtNum(m.rate_limited_total, 0)})`),
      dd('In flight · waiting', `${m.in_flight} · ${m.waiting}`),
      dd('Input ratio', fmtNum(m.input_ratio, 3)),
      dd('Output length', `${fmtNum(m.output_mean, 0)} tokens`)),
    h('div', { class: 'legend' }, 'admitted requests/s · dashed: limit · marks: 429s'),
    lineChart({ t: s.t, values: s.requests_per_sec, limit: rpsLimit, limited: s.rate_limited_per_sec, cls: 'req',
      label: `${m.model}: admitted requests per second over the last 15 minutes against the limit` }),
    h('div', { class: 'legend' }, 'admitted tokens/s · dashed: limit'),
    lineChart({ t: s.t, values: s.tokens_per_sec, limit: tpsLimit, cls: 'tok',
      label: `${m.model}: admitted tokens per second over the last 15 minutes against the limit` }),
    table([{ label: 'Replica' }, { label: 'State' }, { label: 'Share req', num: true }, { label: 'Share tok', num: true },
      { label: 'Req/s', num: true }, { label: 'In flight', num: true }],
    m.replicas.map((r) => [r.replica_id, stateBadge(r.controller_state),
      r.share_requests === null ? 'whole' : `${fmtNum(r.share_requests * 100, 0)} %`,
      r.share_tokens === null ? 'whole' : `${fmtNum(r.share_tokens * 100, 0)} %`,
      fmtNum(r.requests_per_sec, 2), r.in_flight]), { label: `Replicas of ${m.model}` }));
}

function dd(k, v) { return [h('dt', {}, k), h('dd', {}, v)]; }
