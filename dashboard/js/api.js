// The server's JSON API (/api/v1) with the tab's token, errors as ApiError, a run's event stream, analyses polled to their end.
import {h, query, sleep} from './util.js';

function authHeaders() {
  const t = sessionStorage.getItem('circuitlab-token');
  return t ? {Authorization: 'Bearer ' + t} : {};
}

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || 'HTTP ' + status);
    this.status = status;
    this.code = body && body.code;
  }
}

// A response's JSON body, or an ApiError (a 401 shows the token form).
async function answer(r) {
  let body = null;
  try {
    body = await r.json();
  } catch (e) { /* not JSON */
  }
  if (r.status === 401) showLogin();
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

export async function api(path) {
  return answer(await fetch(path, {headers: authHeaders()}));
}

// A text answer (a Markdown report), or an ApiError from its JSON error.
export async function apiText(path) {
  const r = await fetch(path, {headers: authHeaders()});
  if (!r.ok) return answer(r);
  return r.text();
}

function showLogin() {
  document.getElementById('login').hidden = false;
}

export function errorBox(e) {
  return h('p', {class: 'error'}, e instanceof ApiError ? `${e.code || e.status}: ${e.message}` : String(e));
}

// A run's Server-Sent Events over fetch (so the token goes in a header),
// resumed with Last-Event-ID after a dropped connection.
export function openEvents(runId, onEvent) {
  const ctrl = new AbortController();
  let stopped = false, last = null;
  (async () => {
    while (!stopped) {
      try {
        const headers = authHeaders();
        if (last) headers['Last-Event-ID'] = last;
        const r = await fetch(
            `/api/v1/runs/${encodeURIComponent(runId)}/events?include_metrics=true`, {headers, signal: ctrl.signal});
        if (r.status === 503 || r.status === 429) {
          await sleep(5000);
          continue;
        }
        if (!r.ok) return;
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buf += dec.decode(value, {stream: true});
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const frame = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const ev = {id: null, event: 'message', data: ''};
            for (const line of frame.split('\n')) {
              const c = line.indexOf(':');
              if (c <= 0) continue;
              const k = line.slice(0, c), v = line.slice(c + 1).replace(/^ /, '');
              if (k === 'id')
                ev.id = v;
              else if (k === 'event')
                ev.event = v;
              else if (k === 'data')
                ev.data += v;
            }
            if (ev.id) last = ev.id;
            if (!ev.data) continue;
            const msg = JSON.parse(ev.data);
            window.__live.events += 1;
            if (onEvent(ev.event, msg) === 'stop') stopped = true;
          }
        }
        if (!stopped) await sleep(1000);  // the server ended the stream: resume
      } catch (e) {
        if (stopped) return;
        await sleep(2000);
      }
    }
  })();
  return () => {
    stopped = true;
    ctrl.abort();
  };
}

// Asks an analysis of a run: the stored answer (.../stored, never starts a
// job) or, with `start`, the job (polled until it ends; `onProgress` sees
// QUEUED/RUNNING answers). Resolves to the answer; state
// ANALYSIS_STATE_UNSPECIFIED when none is stored.
export async function askAnalysis(id, name, params, start, onProgress, isStopped) {
  const url = `/api/v1/runs/${encodeURIComponent(id)}/${name}${start ? '' : '/stored'}${query(params)}`;
  for (;;) {
    const r = await api(url);
    if (isStopped()) return r;
    if (r.state !== 'ANALYSIS_STATE_QUEUED' && r.state !== 'ANALYSIS_STATE_RUNNING') return r;
    onProgress(r);
    await sleep(600);
  }
}

// POST a JSON body with the tab's token; the server's answer or an ApiError.
export async function apiPost(path, body) {
  return answer(await fetch(path, {method: 'POST', headers: {...authHeaders(), 'Content-Type': 'application/json'},
                                   body: JSON.stringify(body)}));
}
