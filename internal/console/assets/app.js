// The console's shell: the key, the API client, the router. Every page is
// a module exporting render(ctx) that fills ctx.root and may return a
// function that stops what the page started (a stream, a refresh).
import { h, clear } from './dom.js';

const KEY = 'llmq.key';
const pages = {
  overview: () => import('./overview.js'),
  jobs: () => import('./jobs.js'),
  job: () => import('./job.js'),
  dlq: () => import('./dlq.js'),
  usage: () => import('./usage.js'),
};

export class APIError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error && body.error.code;
  }
}

// api calls the llmq API with the session's key; a 401 logs out.
export async function api(path, opts = {}) {
  const headers = { Authorization: 'Bearer ' + (sessionStorage.getItem(KEY) || '') };
  if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, {
    method: opts.method || 'GET', headers, signal: opts.signal,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
  });
  const text = await res.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (res.status === 401) { logout('Your key was refused; log in again.'); }
  if (!res.ok) throw new APIError(res.status, body);
  return body;
}

// session is who the key acts as, read from GET /v1/status: a tenant
// key's document names its tenant, an admin's does not.
export const session = { admin: false, tenant: '' };

let stopPage = null;

async function route() {
  if (stopPage) { stopPage(); stopPage = null; }
  const root = document.getElementById('page');
  clear(root);
  if (!sessionStorage.getItem(KEY)) { showLogin(); return; }
  document.getElementById('login').hidden = true;
  const [path, search = ''] = location.hash.replace(/^#/, '').split('?');
  const [, name = 'overview', ...rest] = path.split('/');
  const param = rest.map(decodeURIComponent).join('/');
  const page = name === 'jobs' && param ? 'job' : name;
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.page === (page === 'job' ? 'jobs' : page)) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const load = pages[page];
  if (!load) { root.append(h('p', {}, 'No such page.')); return; }
  const query = new URLSearchParams(search);
  try {
    const mod = await load();
    stopPage = (await mod.render({ root, param, query, api, session })) || null;
  } catch (e) {
    root.append(h('p', { class: 'error', role: 'alert' }, String(e.message || e)));
  }
}

function showLogin(message) {
  document.getElementById('login').hidden = false;
  document.getElementById('logout').hidden = true;
  document.getElementById('who').textContent = '';
  document.getElementById('login-error').textContent = message || '';
  document.getElementById('login-key').focus();
}

function logout(message) {
  sessionStorage.removeItem(KEY);
  if (stopPage) { stopPage(); stopPage = null; }
  clear(document.getElementById('page'));
  showLogin(message);
}

async function identify() {
  const st = await api('/v1/status');
  session.admin = !st.tenant;
  session.tenant = st.tenant || '';
  document.getElementById('who').textContent = session.admin ? 'admin key: every tenant' : `tenant ${session.tenant}`;
  document.getElementById('logout').hidden = false;
}

// confirmDialog asks the question in the page's modal dialog and resolves
// true on Confirm.
export function confirmDialog(text, okLabel = 'Confirm') {
  const dlg = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = okLabel;
  return new Promise((resolve) => {
    dlg.addEventListener('close', () => resolve(dlg.returnValue === 'ok'), { once: true });
    dlg.returnValue = '';
    dlg.showModal();
  });
}

document.getElementById('login-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const input = document.getElementById('login-key');
  sessionStorage.setItem(KEY, input.value.trim());
  try {
    await identify();
    input.value = '';
    route();
  } catch (e) {
    if (e.status !== 401) logout(String(e.message || e));
  }
});
document.getElementById('logout').addEventListener('click', () => logout());
window.addEventListener('hashchange', route);

(async () => {
  if (sessionStorage.getItem(KEY)) {
    try { await identify(); } catch (e) { if (e.status !== 401) logout(String(e.message || e)); return; }
  }
  route();
})();
