// A run's attention patterns (#/run/ID/attention): one heatmap per head, a
// step slider, the evaluation set's sequences or tokens the user types in.
import {api, apiPost, askAnalysis, errorBox} from '../api.js';
import {colorBar} from '../charts.js';
import {csvOf, downloadBar, savePng, saveText} from '../downloads.js';
import {$view, checkpointSteps, fmt, h, short, sleep} from '../util.js';

// A weight's colour: white (0) to the accent colour (1), on a square-root
// ramp so that small weights stay visible; the colour bar draws the same.
const shadeOf = (v) => {
  const t = Math.sqrt(Math.max(0, Math.min(1, v)));
  const shade = (a, b) => Math.round(a + (b - a) * t);
  return `rgb(${shade(255, 40)},${shade(255, 85)},${shade(255, 199)})`;
};

// One head's pattern (T x T, rows are queries) on a canvas coloured by
// shadeOf, the sequence's tokens (this task's token ids: no task names its
// tokens) along the query axis and, written upward, along the key axis when
// the cells are large enough to read. Returns the canvas; its dataset holds
// what a hover needs.
function heatCanvas(pattern, tokens, cell) {
  const T = pattern.size, pad = cell >= 8 ? 30 : 0;
  const c = h('canvas', {width: pad + T * cell, height: pad + T * cell, class: 'attn'});
  const ctx = c.getContext('2d');
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, c.width, c.height);
  const w = pattern.weights || [];
  for (let q = 0; q < T; q++)
    for (let k = 0; k <= q; k++) {
      ctx.fillStyle = shadeOf(w[q * T + k] || 0);
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
    ctx.save();  // keys along the top, written upward so that they never run into each other
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = 'left';
    tokens.forEach((t, i) => ctx.fillText(String(t), -pad + 3, pad + (i + 0.5) * cell));
    ctx.restore();
  }
  c.dataset.pad = pad;
  c.dataset.cell = cell;
  return c;
}

// The patterns of an answer as CSV: one row per weight of the causal half.
function patternsCsv(answer, seq) {
  const tokens = ((answer.sequences || [])[seq] || {}).tokens || [];
  const rows = [['head', 'layer', 'head_index', 'sequence', 'query', 'query_token', 'key', 'key_token', 'weight']];
  for (const p of (answer.patterns || []).filter((x) => Number(x.sequence || 0) === seq))
    for (let q = 0; q < p.size; q++)
      for (let k = 0; k <= q; k++)
        rows.push([p.name, p.layer || 0, p.head || 0, seq, q, tokens[q], k, tokens[k], p.weights[q * p.size + k] || 0]);
  return csvOf(rows);
}

// GetActivations' attention probabilities (B x H x T x T per layer hook) as
// GetAttentionPatterns' patterns, named as the server names heads ("L{l}H{h}",
// layers and heads from 1).
function patternsOf(acts) {
  const out = [];
  for (const a of acts.activations || []) {
    const [B, H, T] = a.shape.map(Number);
    const l = Number(a.hook.slice(1, a.hook.indexOf('.')));
    for (let b = 0; b < B; b++)
      for (let hd = 0; hd < H; hd++) {
        const off = ((b * H) + hd) * T * T;
        out.push({layer: l, head: hd + 1, name: `L${l}H${hd + 1}`, sequence: b, size: T,
                  weights: a.values.slice(off, off + T * T)});
      }
  }
  return out;
}

// #/run/{id}/attention?step=&set=&sequences=&layer=&head=&tokens=&positions=:
// every head's attention pattern at one checkpoint, as a grid of heatmaps
// (layers x heads) with a colour bar: on a few evaluation sequences (the
// first look at a checkpoint is an analysis job on the server, polled here;
// later looks are stored), or on tokens the user types in (GetActivations,
// POST /api/v1/runs/{id}/activations). A slider over the stored checkpoints
// shows the pattern forming; each view downloads as CSV, a head as PNG.
export function attentionView(id, params) {
  const head = h('div'), controls = h('div', {class: 'filters'}), status = h('p', {class: 'muted', id: 'attention-status'});
  const own = h('div', {class: 'filters', id: 'attention-own'});
  const bar = h('div', {id: 'attention-bar'});
  const grid = h('div', {class: 'heads', id: 'attention-grid'});
  const zoom = h('div', {id: 'attention-zoom'});
  const tip = h('div', {class: 'tip', id: 'attention-tip', hidden: true});
  let stopped = false, answer = null, seq = 0, steps = [], loading = 0, run = null, typed = null;
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

  const scaleBar = () => colorBar(0, 1, shadeOf, 'attention weight', 'attention-scale');

  function enlarge(pattern, tokens) {
    const cell = Math.max(8, Math.min(32, Math.floor(640 / pattern.size)));
    const c = heatCanvas(pattern, tokens, cell);
    c.addEventListener('mousemove', (e) => onHover(e, pattern, tokens));
    c.addEventListener('mouseleave', () => (tip.hidden = true));
    const title = `${run ? run.run_id + ' ' : ''}${pattern.name} step ${answer.step}`;
    zoom.replaceChildren(
        h('div', {class: 'chart-head'},
          h('h3', {}, `${pattern.name} (layer ${pattern.layer || 0}, head ${pattern.head || 0}) `,
            h('a', {href: 'javascript:void 0', onclick: () => zoom.replaceChildren()}, 'close')),
          downloadBar({PNG: () => savePng(c, title, title)})),
        c, scaleBar());
    zoom.scrollIntoView({block: 'nearest'});
  }

  function draw() {
    const tokens = ((answer.sequences || [])[seq] || {}).tokens || [];
    const shown = (answer.patterns || []).filter((p) => Number(p.sequence || 0) === seq);
    const layers = [...new Set(shown.map((p) => Number(p.layer || 0)))].sort((a, b) => a - b);
    const name = `${run ? run.run_id : id}-attention-step-${answer.step}-sequence-${seq}`;
    bar.replaceChildren(h('div', {class: 'chart-head'}, scaleBar(),
                          downloadBar({CSV: () => saveText(`${name}.csv`, patternsCsv(answer, seq), 'text/csv')})));
    grid.replaceChildren(...layers.map((l) => h('div', {class: 'layer', 'data-layer': l}, h('h3', {}, `layer ${l}`),
      h('div', {class: 'row'}, ...shown.filter((p) => Number(p.layer || 0) === l).map((p) => {
        const cell = Math.max(4, Math.min(24, Math.floor(420 / p.size)));
        const c = heatCanvas(p, tokens, cell);
        c.title = 'click to enlarge';
        c.addEventListener('mousemove', (e) => onHover(e, p, tokens));
        c.addEventListener('mouseleave', () => (tip.hidden = true));
        c.addEventListener('click', () => enlarge(p, tokens));
        return h('figure', {class: 'head', 'data-head': p.name, 'data-head-index': p.head || 0}, c,
                 h('figcaption', {}, `${p.name} (head ${p.head || 0})`));
      })))));
    window.__attention = {step: Number(answer.step), patterns: shown.length, drawn: grid.querySelectorAll('canvas').length,
                          state: 'done', eval_set: answer.eval_set, answer, sequence: seq, typed: !!typed};
  }

  const isImir = () => !(run.spec && run.spec.model && run.spec.model.decoder);

  // The tokens typed in, as one sequence of GetActivations: every layer's
  // attention probabilities.
  async function loadTyped(step, mine) {
    const model = run.spec.model.decoder || run.spec.model.imir || {};
    const L = Number(model.num_layers || 0) || 2;
    const hooks = Array.from({length: L}, (_, i) => (isImir() ? `L${i + 1}.attn` : `L${i + 1}.attn.pattern`));
    const seqIn = {tokens: typed.tokens};
    if (isImir()) seqIn.positions = typed.positions.length ? typed.positions : typed.tokens.map((_, i) => i);
    for (;;) {
      const r = await apiPost(`/api/v1/runs/${encodeURIComponent(id)}/activations`, {step, sequences: [seqIn], hooks});
      if (stopped || mine !== loading) return null;
      if (r.state !== 'ANALYSIS_STATE_QUEUED' && r.state !== 'ANALYSIS_STATE_RUNNING') {
        if (r.state !== 'ANALYSIS_STATE_DONE') return r;
        return {state: r.state, step: r.step, eval_set: 'your tokens', sequences: [{tokens: typed.tokens}],
                patterns: patternsOf(r), from_store: r.from_store};
      }
      status.textContent = `${short(r.state, 'ANALYSIS_STATE_').toLowerCase()} (job ${r.job_id}): ` +
          `${Math.round(100 * (r.progress || 0))}%`;
      await sleep(400);
    }
  }

  async function load(step) {
    const mine = ++loading;
    status.textContent = `computing the patterns at step ${step || 'newest'}…`;
    window.__attention.state = 'loading';
    const isStale = () => stopped || mine !== loading;
    let r;
    try {
      r = typed ? await loadTyped(step, mine) :
                  await askAnalysis(id, 'attention', {step, eval_set: params.get('set'), sequences: params.get('sequences') || 2,
                                                      layers: params.get('layer'), heads: params.get('head')},
                                    true, (p) => (status.textContent = `${short(p.state, 'ANALYSIS_STATE_').toLowerCase()} ` +
                                                  `(job ${p.job_id}): ${Math.round(100 * (p.progress || 0))}%`), isStale);
    } catch (e) {
      if (mine === loading) status.replaceChildren(errorBox(e));
      window.__attention.state = 'error';
      return;
    }
    if (isStale() || !r) return;
    if (r.state !== 'ANALYSIS_STATE_DONE') {
      status.replaceChildren(errorBox(r.error || short(r.state, 'ANALYSIS_STATE_')));
      window.__attention.state = 'error';
      return;
    }
    answer = r;
    seq = Math.min(seq, Math.max(0, (r.sequences || []).length - 1));
    status.textContent = `step ${r.step} · ${typed ? 'the tokens typed in' : `${(r.sequences || []).length} sequence(s) of ${r.eval_set}`}` +
        `${r.from_store ? ' (stored)' : ''} · rows are queries, columns keys, labelled by token id; hover to read a weight, ` +
        'click to enlarge';
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

  // "your tokens": comma- or space-separated token ids (and, for an IMIR
  // model, position ids; empty = 0, 1, 2, ...); "evaluation set" goes back.
  function renderOwn() {
    const ids = (v) => v.split(/[\s,]+/).filter(Boolean).map(Number);
    const tokIn = h('input', {id: 'attention-tokens', size: 40, placeholder: 'token ids, e.g. 0 14 30 22 25 14',
                              value: params.get('tokens') || ''});
    const posIn = h('input', {id: 'attention-positions', size: 30, placeholder: 'position ids (empty: 0, 1, 2, …)',
                              value: params.get('positions') || ''});
    const show = h('button', {type: 'button', id: 'attention-own-run'}, 'show');
    const back = h('button', {type: 'button', id: 'attention-eval'}, 'evaluation set');
    show.addEventListener('click', () => {
      const tokens = ids(tokIn.value);
      if (!tokens.length || tokens.some((t) => !Number.isInteger(t))) {
        status.replaceChildren(errorBox('type token ids (integers) separated by spaces or commas'));
        return;
      }
      typed = {tokens, positions: ids(posIn.value)};
      seq = 0;
      load(answer ? Number(answer.step) : steps[steps.length - 1]);
    });
    back.addEventListener('click', () => {
      typed = null;
      load(answer ? Number(answer.step) : steps[steps.length - 1]);
    });
    own.replaceChildren(h('label', {}, 'your tokens ', tokIn), isImir() ? h('label', {}, 'positions ', posIn) : '',
                        show, back);
  }

  (async () => {
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
    renderOwn();
    if (params.get('tokens')) own.querySelector('#attention-own-run').click();
    else load(want || steps[steps.length - 1]);
  })();

  $view.replaceChildren(head, controls, own, status, bar, grid, zoom, tip);
  return () => {
    stopped = true;
  };
}
