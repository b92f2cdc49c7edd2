// Small helpers every view uses: DOM building (h), number and time formats, the shared constants.

export const $view = document.getElementById('view');

export const PALETTE =
    ['#2855c7', '#d1495b', '#00a878', '#edae49', '#7b4fa1', '#30a5bf', '#8c564b', '#e377c2', '#555', '#bcbd22'];

export const FINAL = new Set(['RUN_STATE_SUCCEEDED', 'RUN_STATE_FAILED', 'RUN_STATE_CANCELLED']);

export const COORDS = ['alpha', 'beta', 'gamma', 'delta'];

window.__charts = {};  // title -> uPlot (the browser tests read what was drawn)

window.__live = {
  events: 0,
  metricEvents: 0,
  lastStep: 0
};

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on'))
      el.addEventListener(k.slice(2), v);
    else if (k === 'class')
      el.className = v;
    else
      el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const short = (s, prefix) => (s || '').replace(prefix, '');

export const stateName = (s) => short(s, 'RUN_STATE_');

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function fmt(v) {
  if (v === null || v === undefined || v === '') return '';
  if (typeof v !== 'number') return String(v);
  if (v === 0) return '0';
  const a = Math.abs(v);
  return a >= 1e4 || a < 1e-3 ? v.toExponential(3) : v.toPrecision(4).replace(/\.?0+$/, '');
}

export function when(ts) {
  if (!ts) return '';
  const d = new Date(ts);
  return isNaN(d) ? ts : d.toLocaleString();
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params))
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? '?' + s : '';
}

export const valueKey = (v) => JSON.stringify(v === undefined ? null : v);

// The stored checkpoint steps of a run, from its spec: every
// checkpoint_every steps up to the newest (the last keep_checkpoints of
// them when it is set), and the newest itself (the last step, an early stop).
export function checkpointSteps(run) {
  const newest = Number(run.checkpoint_step || 0);
  const rec = (run.spec && run.spec.recording) || {};
  const every = Number(rec.checkpoint_every || 0), keep = Number(rec.keep_checkpoints || 0);
  const steps = [];
  if (every > 0)
    for (let s = every; s < newest; s += every) steps.push(s);
  if (newest) steps.push(newest);
  return keep > 0 ? steps.slice(-keep) : steps;
}

export const GREEK = {alpha: 'α', beta: 'β', gamma: 'γ', delta: 'δ'};
