// A run's attention patterns (#/run/ID/attention): one heatmap per head, a step slider.
import {api, askAnalysis, errorBox} from '../api.js';
import {$view, checkpointSteps, fmt, h, query, short} from '../util.js';

// One head's pattern (T x T, rows are queries) on a canvas: white to the
// accent colour by weight, the sequence's tokens along the query axis when
// the cells are large enough to read (and along the key axis when larger). Returns the canvas; its dataset holds what
// a hover needs.
function heatCanvas(pattern, tokens, cell) {
  const T = pattern.size, pad = cell >= 10 ? 26 : 0;
  const c = h('canvas', {width: pad + T * cell, height: pad + T * cell, class: 'attn'});
  const ctx = c.getContext('2d');
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, c.width, c.height);
  const w = pattern.weights || [];
  for (let q = 0; q < T; q++)
    for (let k = 0; k <= q; k++) {
      const v = Math.max(0, Math.min(1, w[q * T + k] || 0));
      const shade = (a, b) => Math.round(a + (b - a) * Math.sqrt(v));  // sqrt: small weights stay visible
      ctx.fillStyle = `rgb(${shade(255, 40)},${shade(255, 85)},${shade(255, 199)})`;
      ctx.fillRect(pad + k * cell, pad + q * cell, cell, cell);
    }
  ctx.strokeStyle = '#d9dde6';
  ctx.strokeRect(pad + 0.5, pad + 0.5, T * cell - 1, T * cell - 1);
  if (pad) {
    ctx.fillStyle = '#6b7385';
    ctx.font = `${Math.min(11, cell - 1)}px system-ui, sans-serif`;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    tokens.forEach((t, i) => ctx.fillText(String(t), pad - 3, pad + (i + 0.5) * cell));  // queries
    if (cell >= 18) {  // keys across the top only where they do not run into each other
      ctx.textAlign = 'center';
      tokens.forEach((t, i) => ctx.fillText(String(t), pad + (i + 0.5) * cell, pad - 8));
    }
  }
  c.dataset.pad = pad;
  c.dataset.cell = cell;
  return c;
}

// #/run/{id}/attention?step=&set=&sequences=&layer=&head=: every head's
// attention pattern on a few evaluation sequences at one checkpoint, as a
// grid of heatmaps (layers x heads); a slider over the stored checkpoints
// shows the pattern forming. The first look at a checkpoint is an analysis
// job on the server (QUEUED/RUNNING, polled here); later looks are stored.
export function attentionView(id, params) {
  const head = h('div'), controls = h('div', {class: 'filters'}), status = h('p', {class: 'muted', id: 'attention-status'});
  const grid = h('div', {class: 'heads', id: 'attention-grid'});
  const zoom = h('div', {id: 'attention-zoom'});
  const tip = h('div', {class: 'tip', id: 'attention-tip', hidden: true});
  let stopped = false, answer = null, seq = 0, steps = [], loading = 0;
  window.__attention = {step: 0, patterns: 0, drawn: 0, state: 'loading'};

  function onHover(e, pattern, tokens) {
    const c = e.currentTarget, pad = Number(c.dataset.pad), cell = Number(c.dataset.cell);
    const r = c.getBoundingClientRect();
    const k = Math.floor((e.clientX - r.left - pad) / cell), q = Math.floor((e.clientY - r.top - pad) / cell);
    if (q < 0 || k < 0 || q >= pattern.size || k >= pattern.size) {
      tip.hidden = true;
      return;
    }
    const w = k <= q ? (pattern.weights[q * pattern.size + k] || 0) : 0;
    tip.textContent = `${pattern.name}: query ${q} (token ${tokens[q]}) → key ${k} (token ${tokens[k]}): ${fmt(w)}`;
    tip.hidden = false;
    tip.style.left = `${e.pageX + 12}px`;
    tip.style.top = `${e.pageY + 12}px`;
  }

  function enlarge(pattern, tokens) {
    const cell = Math.max(6, Math.min(28, Math.floor(560 / pattern.size)));
    const c = heatCanvas(pattern, tokens, cell);
    c.addEventListener('mousemove', (e) => onHover(e, pattern, tokens));
    c.addEventListener('mouseleave', () => (tip.hidden = true));
    zoom.replaceChildren(h('h3', {}, `${pattern.name} (layer ${pattern.layer || 0}, head ${pattern.head || 0}) `,
                           h('a', {href: 'javascript:void 0', onclick: () => zoom.replaceChildren()}, 'close')),
                         c);
    zoom.scrollIntoView({block: 'nearest'});
  }

  function draw() {
    const tokens = ((answer.sequences || [])[seq] || {}).tokens || [];
    const shown = (answer.patterns || []).filter((p) => Number(p.sequence || 0) === seq);
    const layers = [...new Set(shown.map((p) => Number(p.layer || 0)))].sort((a, b) => a - b);
    grid.replaceChildren(...layers.map((l) => h('div', {class: 'layer'}, h('h3', {}, `layer ${l}`),
      h('div', {class: 'row'}, ...shown.filter((p) => Number(p.layer || 0) === l).map((p) => {
        const cell = Math.max(3, Math.min(14, Math.floor(240 / p.size)));
        const c = heatCanvas(p, tokens, cell);
        c.title = 'click to enlarge';
        c.addEventListener('mousemove', (e) => onHover(e, p, tokens));
        c.addEventListener('mouseleave', () => (tip.hidden = true));
        c.addEventListener('click', () => enlarge(p, tokens));
        return h('figure', {class: 'head', 'data-head': p.name}, c, h('figcaption', {}, p.name));
      })))));
    window.__attention = {step: Number(answer.step), patterns: shown.length, drawn: grid.querySelectorAll('canvas').length,
                          state: 'done', eval_set: answer.eval_set, answer, sequence: seq};
  }

  async function load(step) {
    const mine = ++loading;
    status.textContent = `computing the patterns at step ${step || 'newest'}…`;
    window.__attention.state = 'loading';
    const isStale = () => stopped || mine !== loading;
    let r;
    try {
      r = await askAnalysis(id, 'attention', {step, eval_set: params.get('set'), sequences: params.get('sequences') || 2,
                                              layers: params.get('layer'), heads: params.get('head')},
                            true, (p) => (status.textContent = `${short(p.state, 'ANALYSIS_STATE_').toLowerCase()} ` +
                                          `(job ${p.job_id}): ${Math.round(100 * (p.progress || 0))}%`), isStale);
    } catch (e) {
      if (mine === loading) status.replaceChildren(errorBox(e));
      window.__attention.state = 'error';
      return;
    }
    if (isStale()) return;
    if (r.state !== 'ANALYSIS_STATE_DONE') {
      status.replaceChildren(errorBox(r.error || short(r.state, 'ANALYSIS_STATE_')));
      window.__attention.state = 'error';
      return;
    }
    answer = r;
    seq = Math.min(seq, Math.max(0, (r.sequences || []).length - 1));
    status.textContent = `step ${r.step} · ${(r.sequences || []).length} sequence(s) of ${r.eval_set}` +
        `${r.from_store ? ' (stored)' : ''} · rows are queries, columns keys; hover to read a weight, click to enlarge`;
    renderControls();
    draw();
  }

  function renderControls() {
    const n = answer ? (answer.sequences || []).length : 0;
    const at = answer ? steps.indexOf(Number(answer.step)) : steps.length - 1;
    const slider = h('input', {type: 'range', id: 'attention-step', min: 0, max: Math.max(0, steps.length - 1),
                               value: Math.max(0, at), disabled: steps.length < 2});
    const label = h('span', {id: 'attention-step-label'}, `step ${steps[Math.max(0, at)] || '-'}`);
    slider.addEventListener('input', () => (label.textContent = `step ${steps[Number(slider.value)]}`));
    slider.addEventListener('change', () => load(steps[Number(slider.value)]));
    const pick = h('select', {id: 'attention-seq'},
                   ...Array.from({length: n}, (_, i) => h('option', {value: i, selected: i === seq}, `sequence ${i}`)));
    pick.addEventListener('change', () => {
      seq = Number(pick.value);
      draw();
    });
    controls.replaceChildren(h('label', {}, 'checkpoint ', slider, ' ', label), n > 1 ? pick : '',
                             h('a', {href: `#/run/${id}`}, 'back to the run'));
  }

  (async () => {
    let run;
    try {
      run = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
    } catch (e) {
      $view.replaceChildren(errorBox(e));
      return;
    }
    head.replaceChildren(h('h2', {}, `${run.run_id} · ${run.name || ''} · attention patterns`));
    steps = checkpointSteps(run);
    if (!steps.length) {
      status.textContent = 'no checkpoint stored yet: the patterns are read from a checkpoint';
      return;
    }
    const want = Number(params.get('step') || 0);
    renderControls();
    load(want || steps[steps.length - 1]);
  })();

  $view.replaceChildren(head, controls, status, grid, zoom, tip);
  return () => {
    stopped = true;
  };
}
