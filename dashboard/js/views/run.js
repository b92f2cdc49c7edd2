// One run (#/run/ID): its curves and coordinates, live while it trains.
import {api, errorBox, openEvents} from '../api.js';
import {Chart, chartControls, groupOf, smooth} from '../charts.js';
import {$view, COORDS, FINAL, fmt, h, query, stateName, when} from '../util.js';

export function runView(id) {
  const opts = {logY: false, smooth: 0};
  const head = h('div');
  const controls = h('div');
  const charts = h('div', {class: 'charts', id: 'charts'});
  const coordIn = h('input', {id: 'coord-names', value: COORDS.join(','), size: 40});
  const extra = h('div');
  const series = new Map();  // metric name -> {xs, ys}
  let coords = [];           // [{label, xs, ys}]
  const byTitle = new Map();
  let run = null, close = null, stopped = false, pending = null, coordTimer = null;

  function drawCharts() {
    const groups = new Map();
    for (const [name, s] of series) {
      const g = groupOf(name);
      if (g === 'coordinates') continue;
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push({label: name, xs: s.xs, ys: s.ys});
    }
    const order = [...groups.keys()].sort((a, b) => (a === 'loss' ? -1 : b === 'loss' ? 1 : a < b ? -1 : 1));
    // rho (in [0, 1]) on its own right-hand axis: on the coordinates' 0-10
    // scale its fall from 0.99 to 0.10 would be a flat line.
    const rho = series.get('manifold/rho');
    const coordSeries =
        coords.concat(rho ? [{label: 'rho (manifold/rho)', xs: rho.xs, ys: rho.ys, axis: 'right', color: '#111',
                              dash: [6, 4]}] :
                            []);
    for (const title of ['coordinates', ...order]) {
      const list = title === 'coordinates' ? coordSeries : groups.get(title);
      if (!list || !list.length) continue;
      if (!byTitle.has(title)) {
        const axes = title === 'coordinates' ? {yLabel: 'coordinate', rightLabel: 'ρ', rightRange: [0, 1]} : {yLabel: title};
        byTitle.set(title, new Chart(charts, title, opts, axes));
      }
      byTitle.get(title).set(list);
    }
  }
  const redrawSoon = () => {
    if (!pending)
      pending = setTimeout(() => {
        pending = null;
        drawCharts();
      }, 500);
  };
  const redrawAll = () => {
    for (const c of byTitle.values()) c.plot && (c.plot.destroy(), c.plot = null);
    drawCharts();
  };

  function renderHead() {
    const p = run.progress || {};
    const frac = Number(p.step || 0) / Math.max(1, Number(p.total_steps || 0));
    head.replaceChildren(
        h('h2', {}, `${run.run_id} · ${run.name || ''} `,
          h('span', {class: 'state ' + stateName(run.state), id: 'run-state'}, stateName(run.state))),
        h('div', {class: 'kv'}, h('span', {class: 'muted'}, 'progress'),
          h('span', {id: 'run-progress'},
            h('span', {class: 'bar'}, h('span', {style: `width:${Math.round(100 * Math.min(1, frac))}%`})),
            ` step ${p.step || 0} / ${p.total_steps || 0}`,
            p.steps_per_second ? ` · ${fmt(p.steps_per_second)} steps/s` : ''),
          h('span', {class: 'muted'}, 'device'), h('span', {}, run.device || '-'),
          (run.packed_with || []).length ?
            [h('span', {class: 'muted'}, 'packed with'),
             h('span', {id: 'run-packed-with'},
               ...run.packed_with.flatMap((id, i) => [i ? ', ' : '', h('a', {href: `#/run/${id}`}, id)]),
               ' (one ensemble job)')] : [],
          h('span', {class: 'muted'}, 'sweep'),
          h('span', {}, run.sweep_id ? h('a', {href: `#/sweep/${run.sweep_id}`}, run.sweep_id) : '-'),
          h('span', {class: 'muted'}, 'tags'), h('span', {}, (run.tags || []).join(', ') || '-'),
          h('span', {class: 'muted'}, 'owner'), h('span', {}, run.owner || '-'),
          h('span', {class: 'muted'}, 'created / finished'),
          h('span', {}, `${when(run.created_at)} / ${when(run.finished_at) || '-'}`),
          h('span', {class: 'muted'}, 'checkpoint'),
          h('span', {id: 'run-checkpoint'},
            Number(run.checkpoint_step) ? `newest at step ${run.checkpoint_step} (attempts: ${run.attempts})` :
                                          'none yet'),
          run.error ? [h('span', {class: 'muted'}, 'error'), h('span', {class: 'error'}, run.error)] : [],
          run.warning ? [h('span', {class: 'muted'}, 'warning'), h('span', {}, run.warning)] : []));
  }

  async function loadMetrics() {
    const m = await api(`/api/v1/runs/${id}/metrics?max_points=2000`);
    series.clear();
    for (const s of m.series || []) series.set(s.name, {xs: s.steps.map(Number), ys: s.values});
  }
  async function loadCoords() {
    const names = coordIn.value.split(',').map((s) => s.trim()).filter(Boolean);
    try {
      const t = await api(`/api/v1/runs/${id}/coordinates` + query({names: names.join(','), max_points: 2000}));
      coords =
          (t.series || []).map((s) => ({
                                 label: s.coordinate.canonical ? `${s.coordinate.canonical} ${s.coordinate.label}` :
                                                                 s.coordinate.label,
                                 xs: s.steps.map(Number),
                                 ys: s.values,
                               }));
    } catch (e) {
      coords = [];  // not an IMIR run, or nothing recorded yet
    }
  }
  coordIn.addEventListener('change', async () => {
    await loadCoords();
    drawCharts();
  });

  function onEvent(kind, ev) {
    if (kind === 'snapshot') {
      run = ev.snapshot;
      renderHead();
    }
    if (kind === 'progress' && run) {
      run.progress = Object.assign(run.progress || {}, ev.progress);
      window.__live.lastStep = Number(ev.progress.step);
      renderHead();
    }
    if (kind === 'metrics') {
      window.__live.metricEvents += 1;
      for (const p of ev.metrics.points || []) {
        const step = Number(p.step);
        if (!series.has(p.name)) series.set(p.name, {xs: [], ys: []});
        const s = series.get(p.name);
        if (s.xs.length && step <= s.xs[s.xs.length - 1]) {
          const i = s.xs.findIndex((x) => x >= step);  // a resumed run recomputes: replace
          if (s.xs[i] === step) {
            s.ys[i] = p.value;
            continue;
          }
          s.xs.splice(i, 0, step);
          s.ys.splice(i, 0, p.value);
        } else {
          s.xs.push(step);
          s.ys.push(p.value);
        }
      }
      redrawSoon();
    }
    if (kind === 'state' && run) {
      run.state = ev.state.state;
      renderHead();
      if (FINAL.has(ev.state.state)) {
        api(`/api/v1/runs/${id}`).then((r) => {
          run = r;
          renderHead();
        });
        loadCoords().then(drawCharts);
        return 'stop';
      }
    }
    return undefined;
  }

  (async () => {
    try {
      run = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
    } catch (e) {
      $view.replaceChildren(errorBox(e));
      return;
    }
    renderHead();
    controls.replaceChildren(
        chartControls(opts, redrawAll),
        h('div', {class: 'filters'}, h('label', {}, 'coordinates ', coordIn),
          h('a', {href: `#/compare${query({runs: id, series: 'train/loss'})}`}, 'compare with other runs'),
          h('a', {href: `#/run/${id}/attention`, id: 'attention-link'}, 'attention patterns'),
          h('a', {href: `#/run/${id}/interventions`, id: 'interventions-link'}, 'interventions'),
          h('a', {href: `#/run/${id}/circuit`, id: 'circuit-link'},
            run.spec && run.spec.model && run.spec.model.decoder ? 'task-vector geometry' : 'circuit')));
    await Promise.all([loadMetrics(), loadCoords()]);
    drawCharts();
    if (stopped) return;
    if (!FINAL.has(run.state)) {
      close = openEvents(id, onEvent);
      const poll = async () => {
        await loadCoords();
        drawCharts();
        if (!stopped && !FINAL.has(run.state)) coordTimer = setTimeout(poll, 4000);
      };
      coordTimer = setTimeout(poll, 4000);
    }
    // The stored circuit label of a finished IMIR run (state UNSPECIFIED: none stored).
    const labelled = run.state === 'RUN_STATE_SUCCEEDED' && run.spec && run.spec.model && run.spec.model.imir;
    const label = labelled ? await api(`/api/v1/runs/${id}/label`).catch(() => null) : null;
    const spec = h('pre', {id: 'run-spec'}, JSON.stringify(run.spec, null, 2));
    extra.replaceChildren(
        label && label.label ? h('p', {}, 'stored circuit label: ', h('b', {id: 'run-label'}, label.label)) : '',
        h('details', {}, h('summary', {}, 'spec (resolved)'), spec));
  })();

  $view.replaceChildren(head, controls, charts, extra);
  return () => {
    stopped = true;
    if (close) close();
    clearTimeout(pending);
    clearTimeout(coordTimer);
  };
}
