// A run's circuit (#/run/ID/circuit): the detected coordinates as a graph, replayed over training.
import {api, askAnalysis, errorBox} from '../api.js';
import {Chart, svgCanvas} from '../charts.js';
import {csvOf, downloadBar, saveSvg, saveText, withTableDownloads} from '../downloads.js';
import {$view, GREEK, fmt, h, query, short} from '../util.js';

const ROLE_COLOUR = {canonical: '#2855c7', shortcut: '#d1495b', aiding: '#8c8c8c'};

// The circuit as a graph: columns input, layer 1..L, out; each kept
// coordinate an edge into its layer (QK: from the layer before; the
// read-out: from the last layer to out), its width proportional to
// |value| (`values`: label -> value at the replayed step, else the
// detected one).
function circuitGraph(answer, layers, values) {
  const W = 160 * (layers + 2), H = 260, colX = (c) => 60 + c * 160;
  const [svg, add] = svgCanvas(W, H, 'circuit-graph');
  // The residual stream: every layer reads and writes it, so a path may
  // skip a layer (a 3-layer model's 1-2 circuit reaches the read-out
  // through layer 3 untouched).
  add('line', {x1: colX(0), y1: H / 2, x2: colX(layers + 1), y2: H / 2, stroke: '#b8bfcc', 'stroke-width': 1.5,
               'stroke-dasharray': '4 4', class: 'residual'});
  const kept = answer.circuit || [];
  const valueOf = (c) => (values && values.has(c.coordinate.label) ? values.get(c.coordinate.label) : c.coordinate.value) || 0;
  const most = Math.max(1e-9, ...kept.map((c) => Math.abs(c.coordinate.value || 0)),
                        ...(values ? [...values.values()].map(Math.abs) : []));
  // Edges into one column bow apart: the k-th of n at offset (k - (n-1)/2) * 56.
  const into = (c) => Number(c.coordinate.layer || 0) === 0 ? layers + 1 : Number(c.coordinate.layer);
  const count = new Map(), seen = new Map();
  kept.forEach((c) => count.set(into(c), (count.get(into(c)) || 0) + 1));
  kept.forEach((c) => {
    const to = into(c), from = to - 1, slot = seen.get(to) || 0;
    seen.set(to, slot + 1);
    const off = (slot - (count.get(to) - 1) / 2) * 56, mid = H / 2 + off;
    const v = valueOf(c), width = 1 + 13 * Math.abs(v) / most;
    const d = `M ${colX(from)} ${H / 2} C ${colX(from) + 50} ${mid}, ${colX(to) - 50} ${mid}, ${colX(to)} ${H / 2}`;
    const path = add('path', {d, fill: 'none', stroke: ROLE_COLOUR[c.role] || '#555', 'stroke-width': width.toFixed(2),
                              'stroke-opacity': 0.8, 'data-label': c.coordinate.label, class: 'edge'});
    const t = document.createElementNS('http://www.w3.org/2000/svg', 'title');
    t.textContent = `${c.coordinate.label} (${c.role}): value ${fmt(v)}, necessity ${fmt(c.necessity)}`;
    path.append(t);
    const name = GREEK[c.coordinate.canonical] || c.coordinate.element || c.coordinate.label;
    add('text', {x: (colX(from) + colX(to)) / 2, y: H / 2 + off * 0.75 - 10 - width / 2, 'text-anchor': 'middle',
                 'font-size': 12, fill: '#1d2330'}, `${name} ${fmt(v)}`);
  });
  for (let c = 0; c <= layers + 1; c++) {
    add('circle', {cx: colX(c), cy: H / 2, r: 7, fill: '#fff', stroke: '#1d2330'});
    add('text', {x: colX(c), y: H - 12, 'text-anchor': 'middle', 'font-size': 12, fill: '#6b7385'},
        c === 0 ? 'input' : c === layers + 1 ? 'out' : `layer ${c}`);
  }
  return svg;
}

// #/run/{id}/circuit: for an IMIR run, the detected circuit (DetectCircuit's
// stored answer, or a button that computes it for a caller who may start
// analyses) as a graph, with a slider replaying its coordinates over the
// recorded trajectory; for a decoder run, the stored task-vector geometry
// (AnalyzeTaskVectors) as small multiples, one chart per quantity with a
// line per layer.
export function circuitView(id, params) {
  const head = h('div'), controls = h('div', {class: 'filters'}), status = h('p', {class: 'muted', id: 'circuit-status'});
  const body = h('div', {id: 'circuit-body'});
  let stopped = false;
  const isStopped = () => stopped;
  window.__circuit = {state: 'loading'};

  const progress = (r) => (status.textContent = `${short(r.state, 'ANALYSIS_STATE_').toLowerCase()} ` +
                                                `(job ${r.job_id || ''}): ${Math.round(100 * (r.progress || 0))}%`);
  // None stored: says so, and offers a button that runs the analysis as a
  // job (a reader's click answers 403 naming its role) and shows its answer.
  function offer(answer, name, text, show) {
    status.textContent = answer.error || 'none stored for this run';
    const button = h('button', {id: 'circuit-compute'}, text);
    button.addEventListener('click', async () => {
      button.disabled = true;
      try {
        show(await askAnalysis(id, name, {}, true, progress, isStopped));
      } catch (e) {
        status.replaceChildren(errorBox(e));
      }
    });
    controls.replaceChildren(button, h('a', {href: `#/run/${id}`}, 'back to the run'));
    window.__circuit = {state: 'none'};
  }

  async function imir(run) {
    const layers = Number(run.spec.model.imir.num_layers || 2);
    const show = async (answer) => {
      if (answer.state !== 'ANALYSIS_STATE_DONE') return offer(answer, 'circuit', 'Detect the circuit', show);
      status.textContent = `step ${answer.step} · ${answer.metric} on ${answer.eval_set}: dense ${fmt(answer.m_dense)}, ` +
          `all coordinates ${fmt(answer.m_ref)}, circuit ${fmt(answer.m_circuit)} (${(answer.circuit || []).length} of ` +
          `${answer.candidates} coordinates kept)` +
          (answer.template_name ? ` · template ${answer.template_name} (layers ${(answer.template_layers || []).join(',')})` : '');
      const labels = (answer.circuit || []).map((c) => c.coordinate.label);
      const t = await api(`/api/v1/runs/${encodeURIComponent(id)}/coordinates` + query({names: labels.join(','), max_points: 2000}));
      const series = new Map((t.series || []).map((s) => [s.coordinate.label, {xs: s.steps.map(Number), ys: s.values}]));
      const steps = [...new Set([...series.values()].flatMap((s) => s.xs))].sort((a, b) => a - b);
      const at = (step) => new Map([...series].map(([label, s]) => {
        let v = null;
        s.xs.forEach((x, i) => { if (x <= step) v = s.ys[i]; });
        return [label, v === null ? 0 : v];
      }));
      const graphBox = h('div', {class: 'scroll'});
      let shownStep = null;
      // The graph as SVG; the circuit's coordinates (and their values at the
      // replayed step) as CSV.
      const files = downloadBar({
        SVG: () => saveSvg(graphBox.querySelector('svg'), `${id}-circuit-step-${shownStep}`),
        CSV: () => {
          const now = shownStep === null ? null : at(shownStep);
          saveText(`${id}-circuit.csv`, csvOf([['label', 'role', 'layer', 'value_detected', 'value_at_step', 'step']].concat(
              (answer.circuit || []).map((c) => [c.coordinate.label, c.role || '', c.coordinate.layer || 0, c.coordinate.value,
                                                  now && now.has(c.coordinate.label) ? now.get(c.coordinate.label) : '',
                                                  shownStep === null ? '' : shownStep]))), 'text/csv');
        },
      });
      const draw = (step) => {
        shownStep = step;
        graphBox.replaceChildren(circuitGraph(answer, layers, step === null ? null : at(step)));
        window.__circuit = {state: 'done', step, edges: graphBox.querySelectorAll('path.edge').length,
                            widths: [...graphBox.querySelectorAll('path.edge')].map((p) => Number(p.getAttribute('stroke-width'))),
                            template: answer.template_name};
      };
      const slider = h('input', {type: 'range', id: 'circuit-step', min: 0, max: Math.max(0, steps.length - 1),
                                 value: Math.max(0, steps.length - 1), disabled: steps.length < 2});
      const label = h('span', {id: 'circuit-step-label'}, steps.length ? `step ${steps[steps.length - 1]}` : 'no trajectory');
      slider.addEventListener('input', () => {
        label.textContent = `step ${steps[Number(slider.value)]}`;
        draw(steps[Number(slider.value)]);
      });
      controls.replaceChildren(h('label', {}, 'replay the coordinates ', slider, ' ', label),
                               h('a', {href: `#/run/${id}`}, 'back to the run'));
      body.replaceChildren(files, graphBox,
                           h('p', {class: 'muted'}, 'edge width ∝ |coordinate|; colour: canonical (blue), shortcut (red), ' +
                                                     'aiding (grey); dashed: the residual stream; hover an edge for its ' +
                                                     'value and necessity'));
      draw(steps.length ? steps[steps.length - 1] : null);
    };
    show(await askAnalysis(id, 'circuit', {}, false, progress, isStopped));
  }

  async function decoder() {
    showDecoder(await askAnalysis(id, 'task-vectors', {}, false, progress, isStopped));
  }
  function showDecoder(answer) {
    if (answer.state !== 'ANALYSIS_STATE_DONE') {
      return offer(answer, 'task-vectors', 'Analyse the task vectors', showDecoder);
    }
    controls.replaceChildren(h('a', {href: `#/run/${id}`}, 'back to the run'));
    const byName = new Map();
    for (const v of answer.values || []) {
      if (!byName.has(v.name)) byName.set(v.name, []);
      byName.get(v.name).push(v);
    }
    const charts = h('div', {class: 'charts small'}), scalars = [];
    const opts = {logY: false, smooth: 0, xLabel: 'position t'};
    for (const [name, vs] of byName) {
      if (vs.some((v) => Number(v.position) >= 0)) {
        const layers = [...new Set(vs.map((v) => Number(v.layer)))].sort((a, b) => a - b);
        new Chart(charts, name, opts).set(layers.map((l) => {
          const pts = vs.filter((v) => Number(v.layer) === l).sort((a, b) => Number(a.position) - Number(b.position));
          return {label: l < 0 ? name : `layer ${l}`, xs: pts.map((v) => Number(v.position)), ys: pts.map((v) => v.value)};
        }));
      } else {
        for (const v of vs) scalars.push(v);
      }
    }
    status.textContent = `step ${(answer.values || [{}])[0].step || ''} · ${byName.size} quantities ` +
        `(AnalyzeTaskVectors${answer.from_store ? ', stored' : ''}) · a line per layer`;
    body.replaceChildren(charts, h('h3', {}, 'per layer'), withTableDownloads(h('table', {class: 'grid', id: 'tv-scalars'},
      h('thead', {}, h('tr', {}, h('th', {}, 'quantity'), h('th', {}, 'layer'), h('th', {}, 'value'))),
      h('tbody', {}, scalars.map((v) => h('tr', {}, h('td', {}, v.name), h('td', {}, Number(v.layer) < 0 ? '-' : v.layer),
                                          h('td', {class: 'num'}, fmt(v.value)))))), `${id} task vectors per layer`));
    window.__circuit = {state: 'done', charts: charts.querySelectorAll('.chart').length, scalars: scalars.length};
  }

  (async () => {
    let run;
    try {
      run = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
      const isDecoder = !!(run.spec && run.spec.model && run.spec.model.decoder);
      head.replaceChildren(h('h2', {}, `${run.run_id} · ${run.name || ''} · ${isDecoder ? 'task-vector geometry' : 'circuit'}`));
      await (isDecoder ? decoder() : imir(run));
    } catch (e) {
      status.replaceChildren(errorBox(e));
      window.__circuit = {state: 'error'};
    }
  })();
  $view.replaceChildren(head, controls, status, body);
  return () => {
    stopped = true;
  };
}
