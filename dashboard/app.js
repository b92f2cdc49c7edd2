// circuitlab dashboard: a single page over the server's read-only JSON API
// (/api/v1, protobuf's JSON mapping with proto field names) and its run event
// streams. No build step; charts are uPlot (vendor/uplot).
'use strict';

// ---------------------------------------------------------------- helpers ---

const $view = document.getElementById('view');
const PALETTE =
    ['#2855c7', '#d1495b', '#00a878', '#edae49', '#7b4fa1', '#30a5bf', '#8c564b', '#e377c2', '#555', '#bcbd22'];
const FINAL = new Set(['RUN_STATE_SUCCEEDED', 'RUN_STATE_FAILED', 'RUN_STATE_CANCELLED']);
const COORDS = ['alpha', 'beta', 'gamma', 'delta'];
window.__charts = {};  // title -> uPlot (the browser tests read what was drawn)
window.__live = {
  events: 0,
  metricEvents: 0,
  lastStep: 0
};

function h(tag, attrs, ...children) {
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
const short = (s, prefix) => (s || '').replace(prefix, '');
const stateName = (s) => short(s, 'RUN_STATE_');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function fmt(v) {
  if (v === null || v === undefined || v === '') return '';
  if (typeof v !== 'number') return String(v);
  if (v === 0) return '0';
  const a = Math.abs(v);
  return a >= 1e4 || a < 1e-3 ? v.toExponential(3) : v.toPrecision(4).replace(/\.?0+$/, '');
}
function when(ts) {
  if (!ts) return '';
  const d = new Date(ts);
  return isNaN(d) ? ts : d.toLocaleString();
}
function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params))
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? '?' + s : '';
}

// ------------------------------------------------------------------- API ---

function authHeaders() {
  const t = sessionStorage.getItem('circuitlab-token');
  return t ? {Authorization: 'Bearer ' + t} : {};
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || 'HTTP ' + status);
    this.status = status;
    this.code = body && body.code;
  }
}

async function api(path) {
  const r = await fetch(path, {headers: authHeaders()});
  let body = null;
  try {
    body = await r.json();
  } catch (e) { /* not JSON */
  }
  if (r.status === 401) showLogin();
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

function showLogin() {
  document.getElementById('login').hidden = false;
}
document.getElementById('login-form').addEventListener('submit', (e) => {
  e.preventDefault();
  sessionStorage.setItem('circuitlab-token', document.getElementById('token').value.trim());
  document.getElementById('login').hidden = true;
  route();
});

function errorBox(e) {
  return h('p', {class: 'error'}, e instanceof ApiError ? `${e.code || e.status}: ${e.message}` : String(e));
}

// --------------------------------------------------------------- charts ---

// Exponential moving average, debiased at the start (as TensorBoard's).
function smooth(ys, weight) {
  if (!weight) return ys;
  let s = 0, n = 0;
  return ys.map((y) => {
    if (y === null || !isFinite(y)) return y;
    n += 1;
    s = weight * s + (1 - weight) * y;
    return s / (1 - Math.pow(weight, n));
  });
}

// series: [{label, xs, ys}] with their own x values; aligned with uPlot.join.
function chartData(series, opts) {
  if (!series.length) return [[]];
  const tables = series.map((s) => {
    let ys = smooth(s.ys, opts.smooth);
    if (opts.logY) ys = ys.map((y) => (y > 0 ? y : null));
    return [s.xs, ys];
  });
  return uPlot.join(tables);
}

class Chart {
  constructor(parent, title, opts) {
    this.title = title;
    this.opts = opts;  // shared {logY, smooth}
    this.series = [];
    this.box = h('div', {class: 'chart', 'data-chart': title}, h('h3', {}, title));
    parent.append(this.box);
    this.plot = null;
  }
  set(series) {
    this.series = series;
    this.draw();
  }
  draw() {
    const width = Math.max(320, this.box.clientWidth - 16);
    const data = chartData(this.series, this.opts);
    const labels = this.series.map((s) => s.label).join('\u0001');
    if (this.plot && this.plotLabels === labels && this.plotLog === this.opts.logY) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.plotLabels = labels;
    this.plotLog = this.opts.logY;
    this.plot = new uPlot(
        {
          width,
          height: 260,
          scales: {x: {time: false}, y: this.opts.logY ? {distr: 3} : {}},
          axes: [{label: this.opts.xLabel || 'step'}, {}],
          cursor: {sync: {key: 'circuitlab'}},
          series: [
            {label: this.opts.xLabel || 'step'}, ...this.series.map((s, i) => ({
                                                  label: s.label,
                                                  stroke: PALETTE[i % PALETTE.length],
                                                  width: 1.5,
                                                  spanGaps: true,
                                                  value: (u, v) => fmt(v),
                                                }))
          ],
        },
        data, this.box);
    window.__charts[this.title] = this.plot;
  }
}

function chartControls(opts, redraw) {
  const log = h('input', {type: 'checkbox', checked: opts.logY});
  log.addEventListener('change', () => {
    opts.logY = log.checked;
    redraw();
  });
  const sm = h('input', {type: 'range', min: 0, max: 0.99, step: 0.01, value: opts.smooth});
  const smLabel = h('span', {}, String(opts.smooth));
  sm.addEventListener('input', () => {
    opts.smooth = Number(sm.value);
    smLabel.textContent = sm.value;
    redraw();
  });
  return h('div', {class: 'filters'}, h('label', {}, log, ' log y'), h('label', {}, 'smoothing ', sm, ' ', smLabel));
}

// "eval/icl_rare/accuracy" -> the chart it goes on.
function groupOf(name) {
  if (name.startsWith('manifold/')) return 'coordinates';
  if (name.startsWith('tv/')) return 'task vectors: ' + name.split('/')[1];
  const parts = name.split('/');
  return parts[parts.length - 1];
}

// -------------------------------------------------------- event streams ---

// A run's Server-Sent Events over fetch (so the token goes in a header),
// resumed with Last-Event-ID after a dropped connection.
function openEvents(runId, onEvent) {
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

// ------------------------------------------------------------ runs view ---

const runCache = new Map();  // finished runs do not change

async function runDetail(id) {
  if (runCache.has(id)) return runCache.get(id);
  const r = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
  if (FINAL.has(r.state)) runCache.set(id, r);
  return r;
}

function defaultColumns(runs) {
  const keys = new Set();
  for (const r of runs)
    for (const k of Object.keys((r.progress && r.progress.latest) || {})) keys.add(k);
  // The science's two questions first: in-context (icl_rare) and in-weights (iwl) accuracy.
  const rank = (k) => (k.includes('/icl_rare/') ? 0 : k.includes('/iwl/') ? 1 : 2);
  const acc = [...keys]
                  .filter((k) => k.startsWith('eval/') && k.endsWith('/accuracy'))
                  .sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : 1))
                  .slice(0, 2);
  return (keys.has('train/loss') ? ['train/loss'] : []).concat(acc);
}

function runsView(params) {
  const saved = JSON.parse(localStorage.getItem('circuitlab-runs') || '{}');
  const f = {
    states: params.get('states') || saved.states || '',
    tags: params.get('tags') || saved.tags || '',
    sweep_id: params.get('sweep') || saved.sweep_id || '',
    columns: saved.columns || '',
    sort: saved.sort || 'created',
    desc: saved.desc !== false,
  };
  const stateSel = h('select', {id: 'f-state'}, [
    '', 'queued', 'running', 'succeeded', 'failed', 'cancelled'
  ].map((s) => h('option', {value: s, selected: s === f.states}, s || 'any state')));
  const tagIn = h('input', {id: 'f-tag', placeholder: 'tag', value: f.tags, size: 12});
  const sweepIn = h('input', {id: 'f-sweep', placeholder: 'sweep (s1)', value: f.sweep_id, size: 8});
  const colIn =
      h('input', {id: 'f-columns', placeholder: 'metric columns, comma-separated', value: f.columns, size: 40});
  const status = h('span', {class: 'muted'});
  const table = h('table', {class: 'grid', id: 'runs'});
  let runs = [], timer = null, stopped = false;

  const save = () => localStorage.setItem('circuitlab-runs', JSON.stringify(f));
  const onFilter = () => {
    f.states = stateSel.value;
    f.tags = tagIn.value.trim();
    f.sweep_id = sweepIn.value.trim();
    f.columns = colIn.value.trim();
    save();
    refresh();
  };
  for (const el of [stateSel, tagIn, sweepIn, colIn]) el.addEventListener('change', onFilter);

  function render() {
    const cols = f.columns ? f.columns.split(',').map((s) => s.trim()).filter(Boolean) : defaultColumns(runs);
    const value = (r, key) => {
      switch (key) {
        case 'run':
          return Number(r.run_id.replace(/\D/g, ''));
        case 'name':
          return r.name;
        case 'state':
          return stateName(r.state);
        case 'progress':
          return r.progress ? Number(r.progress.step) / Math.max(1, Number(r.progress.total_steps)) : 0;
        case 'sweep':
          return r.sweep_id;
        case 'created':
          return r.created_at || '';
        default:
          return r.progress && r.progress.latest ? r.progress.latest[key] : undefined;
      }
    };
    const sorted = [...runs].sort((a, b) => {
      const x = value(a, f.sort), y = value(b, f.sort);
      const c = x === y ? 0 : x === undefined ? 1 : y === undefined ? -1 : x < y ? -1 : 1;
      return f.desc ? -c : c;
    });
    const th = (key, label) =>
        h('th', {
          onclick: () => {
            f.desc = f.sort === key ? !f.desc : true;
            f.sort = key;
            save();
            render();
          },
        },
          label, f.sort === key ? (f.desc ? ' ▾' : ' ▴') : '');
    table.replaceChildren(
        h('thead', {},
          h('tr', {}, th('run', 'run'), th('name', 'name'), th('state', 'state'), th('progress', 'progress'),
            th('sweep', 'sweep'), h('th', {}, 'tags'), th('created', 'created'), cols.map((c) => th(c, c)))),
        h('tbody', {}, sorted.map((r) => {
          const p = r.progress || {};
          const frac = Number(p.step || 0) / Math.max(1, Number(p.total_steps || 0));
          return h(
              'tr', {'data-run': r.run_id}, h('td', {}, h('a', {href: `#/run/${r.run_id}`}, r.run_id)),
              h('td', {}, r.name), h('td', {}, h('span', {class: 'state ' + stateName(r.state)}, stateName(r.state))),
              h('td', {},
                h('span', {class: 'bar'}, h('span', {style: `width:${Math.round(100 * Math.min(1, frac))}%`})), ' ',
                `${p.step || 0}/${p.total_steps || 0}`),
              h('td', {}, r.sweep_id ? h('a', {href: `#/sweep/${r.sweep_id}`}, r.sweep_id) : ''),
              h('td', {}, (r.tags || []).join(', ')), h('td', {}, when(r.created_at)),
              cols.map((c) => h('td', {class: 'num'}, fmt(value(r, c)))));
        })));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const list =
          await api('/api/v1/runs' + query({states: f.states, tags: f.tags, sweep_id: f.sweep_id, page_size: 100}));
      runs = await Promise.all((list.runs || []).map((r) => runDetail(r.run_id).catch(() => r)));
      status.textContent = `${runs.length} of ${list.total_size} run(s) · refreshed ${new Date().toLocaleTimeString()}`;
      render();
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
    if (!stopped) timer = setTimeout(refresh, 3000);
  }
  $view.replaceChildren(
      h('h2', {}, 'Runs'), h('div', {class: 'filters'}, stateSel, tagIn, sweepIn, colIn, status), table);
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// ------------------------------------------------------------- run view ---

function runView(id) {
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
    const rho = series.get('manifold/rho');
    const coordSeries = coords.concat(rho ? [{label: 'rho (manifold/rho)', xs: rho.xs, ys: rho.ys}] : []);
    for (const title of ['coordinates', ...order]) {
      const list = title === 'coordinates' ? coordSeries : groups.get(title);
      if (!list || !list.length) continue;
      if (!byTitle.has(title)) byTitle.set(title, new Chart(charts, title, opts));
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
          h('span', {class: 'muted'}, 'device'), h('span', {}, run.device || '-'), h('span', {class: 'muted'}, 'sweep'),
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

// ----------------------------------------------------------- sweep view ---

function colorScale(t) {  // 0..1 -> a blue-to-yellow ramp (viridis-like)
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const x = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}
const textOn = (rgb) => {
  const [r, g, b] = rgb.match(/\d+/g).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b > 140 ? '#111' : '#fff';
};
const valueKey = (v) => JSON.stringify(v === undefined ? null : v);

// The value a sweep's map opens on. A sweep of IMIR runs that stop at an
// accuracy (a phase diagram: `training.stop_metric`) ends with that
// accuracy flat over the map, so it opens on its label map (`pair`: which
// layer pair carries the induction head, computed as analysis jobs);
// other sweeps on the in-context accuracy.
function defaultValue(sweep, columns) {
  const base = (sweep.spec && sweep.spec.base) || {};
  const imir = !(base.model && base.model.decoder) && !(base.task && base.task.latent);
  if (imir && base.training && base.training.stop_metric) return 'pair';
  return columns.includes('eval/icl_rare/accuracy') ? 'eval/icl_rare/accuracy' : columns[0];
}

function sweepView(id, params) {
  const pick =
      {x: params.get('x'), y: params.get('y'), value: params.get('value'), aggregate: params.get('aggregate') || ''};
  const head = h('div'), controls = h('div', {class: 'filters'}), heat = h('div', {id: 'heatmap'}), members = h('div');
  let stopped = false, timer = null;

  async function load() {
    clearTimeout(timer);
    let sweep, summary;
    try {
      sweep = await api(`/api/v1/sweeps/${encodeURIComponent(id)}`);
      summary = await api(`/api/v1/sweeps/${encodeURIComponent(id)}/summary`);
    } catch (e) {
      $view.replaceChildren(errorBox(e));
      return;
    }
    const states = Object.entries(sweep.states || {}).map(([k, v]) => `${stateName(k)} ${v}`).join(' · ');
    head.replaceChildren(
        h('h2', {}, `${sweep.sweep_id} · ${sweep.name}`),
        h('p', {}, `${(sweep.run_ids || []).length} run(s): ${states}${sweep.done ? ' (done)' : ''} · `,
          h('a', {
            href:
                `#/compare${query({runs: (sweep.run_ids || []).join(','), series: summary.columns[0] || 'train/loss'})}`
          },
            'compare members'),
          ' · ',
          h('a', {
            href: `#/${query({})}`,
            onclick: (e) => {
              e.preventDefault();
              localStorage.setItem('circuitlab-runs', JSON.stringify({sweep_id: id}));
              location.hash = '#/';
            }
          },
            'members in the runs table')));
    const axes = summary.axes || [];
    const choices = axes.concat(summary.columns || []);
    pick.x = pick.x || axes[0];
    pick.y = pick.y || axes[1] || axes[0];
    const cols = summary.columns || [];
    pick.value = pick.value || defaultValue(sweep, cols);
    const sel = (name, list) => {
      const s =
          h('select', {id: 'pivot-' + name}, list.map((c) => h('option', {value: c, selected: c === pick[name]}, c)));
      s.addEventListener('change', () => {
        pick[name] = s.value;
        drawHeat();
      });
      return s;
    };
    const valIn = h('input', {id: 'pivot-value', value: pick.value, list: 'pivot-values', size: 28});
    valIn.addEventListener('change', () => {
      pick.value = valIn.value.trim();
      drawHeat();
    });
    const aggSel = h('select', {id: 'pivot-aggregate'}, [
      '', 'mean', 'min', 'max', 'count'
    ].map((a) => h('option', {value: a, selected: a === pick.aggregate}, a || 'mean')));
    aggSel.addEventListener('change', () => {
      pick.aggregate = aggSel.value;
      drawHeat();
    });
    controls.replaceChildren(
        h('label', {}, 'x ', sel('x', choices)), h('label', {}, 'y ', sel('y', choices)),
        h('label', {}, 'value ', valIn),
        h('datalist', {id: 'pivot-values'},
          (summary.columns || []).concat(['circuit', 'pair', 'coord:alpha', 'coord:beta']).map((c) => h('option', {
                                                                                                 value: c
                                                                                               }))),
        h('label', {}, 'aggregate ', aggSel));
    members.replaceChildren(
        h('h3', {}, 'Members'),
        h('div', {class: 'scroll'},
          h('table', {class: 'grid', id: 'members'},
            h('thead', {},
              h('tr', {}, h('th', {}, 'run'), h('th', {}, 'state'), axes.map((a) => h('th', {}, a)),
                (summary.columns || []).map((c) => h('th', {}, c)))),
            h('tbody', {},
              (summary.rows || [])
                  .map(
                      (r) =>
                          h('tr', {}, h('td', {}, h('a', {href: `#/run/${r.run_id}`}, r.run_id)),
                            h('td', {}, h('span', {class: 'state ' + stateName(r.state)}, stateName(r.state))),
                            (r.swept || []).map((v) => h('td', {}, fmt(v))),
                            (r.values || []).map((v) => h('td', {class: 'num'}, fmt(v)))))))));
    await drawHeat(summary);
    if (!sweep.done && !stopped) timer = setTimeout(load, 4000);
  }

  async function drawHeat() {
    if (!pick.x || !pick.y || !pick.value) return;
    let s;
    try {
      s = await api(
          `/api/v1/sweeps/${encodeURIComponent(id)}/summary` +
          query({pivot: [pick.x, pick.y, pick.value].concat(pick.aggregate ? [pick.aggregate] : []).join(',')}));
    } catch (e) {
      heat.replaceChildren(errorBox(e));
      return;
    }
    const p = s.pivot, xs = p.x_values || [], ys = p.y_values || [], cells = p.cells || [];
    const numbers = cells.filter((c) => typeof c === 'number');
    const texts = [...new Set(cells.filter((c) => typeof c === 'string'))].sort();
    const lo = Math.min(...numbers), hi = Math.max(...numbers);
    const colour = (v) => typeof v === 'number' ? colorScale(hi > lo ? (v - lo) / (hi - lo) : 0.5) :
        typeof v === 'string'                   ? PALETTE[texts.indexOf(v) % PALETTE.length] :
                                                  '#f0f0f0';
    // The runs behind each cell (axes only: value columns are not coordinates of the grid).
    const axes = s.axes || [];
    const ax = axes.indexOf(p.x), ay = axes.indexOf(p.y);
    const runsAt = (xv, yv) => (s.rows || [])
                                   .filter(
                                       (r) => (ax < 0 || valueKey(r.swept[ax]) === valueKey(xv)) &&
                                           (ay < 0 || valueKey(r.swept[ay]) === valueKey(yv)))
                                   .map((r) => r.run_id);
    const metricLike = !['circuit', 'pair', 'pair_predicted'].includes(p.value);
    const stateOf = new Map((s.rows || []).map((r) => [r.run_id, stateName(r.state)]));
    // The y axis grows upward, as the CLI's map (and a plot) draws it.
    const rows = ys.map((yv, j) => [yv, j]).reverse().map(
        ([yv, j]) => h('tr', {}, h('th', {}, fmt(yv)), xs.map((xv, i) => {
          const v = cells[j * xs.length + i];
          const bg = colour(v), ids = runsAt(xv, yv);
          const href = ids.length === 1 ?
              `#/run/${ids[0]}` :
              `#/compare${query({runs: ids.join(','), series: metricLike ? p.value : 'train/loss'})}`;
          const tip = ids.map((r) => `${r} ${stateOf.get(r) || ''}`).join(', ') +
              ` · ${p.value} ${v === null ? (s.pending ? 'pending' : 'none yet') : fmt(v)}`;
          return h(
              'td', {class: 'cell', style: `background:${bg}`, 'data-value': v === null ? '' : String(v)},
              h('a', {href, style: `color:${textOn(bg.startsWith('#') ? hexToRgb(bg) : bg)}`, title: tip},
                v === null ? '–' : fmt(v)));
        })));
    const legend = texts.length ?
        h('div', {class: 'legend', id: 'heat-legend'},
          texts.map((t, i) => h('span', {}, h('i', {style: `background:${PALETTE[i % PALETTE.length]}`}), t))) :
        numbers.length ? h('div', {class: 'legend', id: 'heat-legend'}, fmt(lo), ' ',
                           h('canvas', {class: 'scale', id: 'heat-scale', width: 200, height: 12}), ' ', fmt(hi)) :
                         '';
    heat.replaceChildren(
        h('h3', {}, `${p.value} by ${p.x} (x) and ${p.y} (y)`),
        h('table', {class: 'heat'},
          h('thead', {}, h('tr', {}, h('th', {}, `${p.y} \\ ${p.x}`), xs.map((x) => h('th', {}, fmt(x))))),
          h('tbody', {}, rows)),
        legend, s.pending ? h('p', {class: 'muted'}, `${s.pending} label(s) still being computed…`) : '');
    const scale = document.getElementById('heat-scale');
    if (scale) {
      const g = scale.getContext('2d');
      for (let i = 0; i < 200; i++) {
        g.fillStyle = colorScale(i / 199);
        g.fillRect(i, 0, 1, 12);
      }
    }
    if (s.pending && !stopped) {
      clearTimeout(timer);
      timer = setTimeout(load, 2000);
    }
  }

  $view.replaceChildren(head, controls, heat, members);
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
function hexToRgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return `rgb(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255})`;
}

// --------------------------------------------------------- compare view ---

function compareView(params) {
  const opts = {logY: false, smooth: 0};
  const runsIn = h('input', {id: 'cmp-runs', value: params.get('runs') || '', size: 40, placeholder: 'r1,r2,r3'});
  const seriesIn = h(
      'input',
      {id: 'cmp-series', value: params.get('series') || 'train/loss', size: 32, placeholder: 'metric or coord:alpha'});
  const charts = h('div', {class: 'charts'});
  const status = h('p', {class: 'muted'});
  let chart = null;

  async function load() {
    const ids = runsIn.value.split(',').map((s) => s.trim()).filter(Boolean);
    const name = seriesIn.value.trim();
    history.replaceState(null, '', '#/compare' + query({runs: ids.join(','), series: name}));
    if (!ids.length || !name) {
      status.textContent = 'Name some runs and a metric (or coord:<name>).';
      return;
    }
    const coord = name.startsWith('coord:') ? name.slice(6) : null;
    const list = [];
    const missing = [];
    await Promise.all(ids.map(async (rid) => {
      try {
        if (coord) {
          const t = await api(`/api/v1/runs/${rid}/coordinates` + query({names: coord, max_points: 2000}));
          const s = (t.series || [])[0];
          if (s)
            list.push({label: rid, xs: s.steps.map(Number), ys: s.values});
          else
            missing.push(rid);
        } else {
          const m = await api(`/api/v1/runs/${rid}/metrics` + query({names: name, max_points: 2000}));
          const s = (m.series || [])[0];
          if (s)
            list.push({label: rid, xs: s.steps.map(Number), ys: s.values});
          else
            missing.push(rid);
        }
      } catch (e) {
        missing.push(`${rid} (${e.message})`);
      }
    }));
    list.sort((a, b) => ids.indexOf(a.label) - ids.indexOf(b.label));
    status.textContent = missing.length ? `no ${name} for: ${missing.join(', ')}` : `${list.length} run(s)`;
    if (!chart) chart = new Chart(charts, name, opts);
    chart.title = name;
    chart.box.querySelector('h3').textContent = name;
    chart.plot && (chart.plot.destroy(), chart.plot = null);
    chart.set(list);
  }
  runsIn.addEventListener('change', load);
  seriesIn.addEventListener('change', load);
  $view.replaceChildren(
      h('h2', {}, 'Compare'),
      h('div', {class: 'filters'}, h('label', {}, 'runs ', runsIn), h('label', {}, 'series ', seriesIn)),
      chartControls(opts, () => {
        if (chart) {
          chart.plot && (chart.plot.destroy(), chart.plot = null);
          chart.draw();
        }
      }), status, charts);
  load();
  return () => {};
}

// ------------------------------------------------------- attention view ---

// The stored checkpoint steps of a run, from its spec: every
// checkpoint_every steps up to the newest (the last keep_checkpoints of
// them when it is set), and the newest itself (the last step, an early stop).
function checkpointSteps(run) {
  const newest = Number(run.checkpoint_step || 0);
  const rec = (run.spec && run.spec.recording) || {};
  const every = Number(rec.checkpoint_every || 0), keep = Number(rec.keep_checkpoints || 0);
  const steps = [];
  if (every > 0)
    for (let s = every; s < newest; s += every) steps.push(s);
  if (newest) steps.push(newest);
  return keep > 0 ? steps.slice(-keep) : steps;
}

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
function attentionView(id, params) {
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

// --------------------------------------------------------- circuit view ---

// Asks an analysis of a run: the stored answer (.../stored, never starts a
// job) or, with `start`, the job (polled until it ends; `onProgress` sees
// QUEUED/RUNNING answers). Resolves to the answer; state
// ANALYSIS_STATE_UNSPECIFIED when none is stored.
async function askAnalysis(id, name, params, start, onProgress, isStopped) {
  const url = `/api/v1/runs/${encodeURIComponent(id)}/${name}${start ? '' : '/stored'}${query(params)}`;
  for (;;) {
    const r = await api(url);
    if (isStopped()) return r;
    if (r.state !== 'ANALYSIS_STATE_QUEUED' && r.state !== 'ANALYSIS_STATE_RUNNING') return r;
    onProgress(r);
    await sleep(600);
  }
}

const GREEK = {alpha: 'α', beta: 'β', gamma: 'γ', delta: 'δ'};
const ROLE_COLOUR = {canonical: '#2855c7', shortcut: '#d1495b', aiding: '#8c8c8c'};

// An SVG element of W x H with `id`, and add(tag, attrs, text) appending a
// child element (returned) to it.
function svgCanvas(W, H, id) {
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('width', W);
  svg.setAttribute('height', H);
  svg.setAttribute('id', id);
  const add = (tag, attrs, text) => {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    svg.append(el);
    return el;
  };
  return [svg, add];
}

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
function circuitView(id, params) {
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
      const draw = (step) => {
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
      body.replaceChildren(graphBox,
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
    body.replaceChildren(charts, h('h3', {}, 'per layer'), h('table', {class: 'grid', id: 'tv-scalars'},
      h('thead', {}, h('tr', {}, h('th', {}, 'quantity'), h('th', {}, 'layer'), h('th', {}, 'value'))),
      h('tbody', {}, scalars.map((v) => h('tr', {}, h('td', {}, v.name), h('td', {}, Number(v.layer) < 0 ? '-' : v.layer),
                                          h('td', {class: 'num'}, fmt(v.value)))))));
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

// ---------------------------------------------------- interventions view ---

// POST a JSON body with the tab's token; the server's answer or an ApiError.
async function apiPost(path, body) {
  const r = await fetch(path, {method: 'POST', headers: {...authHeaders(), 'Content-Type': 'application/json'},
                               body: JSON.stringify(body)});
  let out = null;
  try {
    out = await r.json();
  } catch (e) { /* not JSON */
  }
  if (r.status === 401) showLogin();
  if (!r.ok) throw new ApiError(r.status, out);
  return out;
}

// One line per edit of a request: "OP_ZERO_COORDINATE beta", "OP_ABLATE_HEAD L2H1", ...
function describeRequest(rq) {
  const edits = (rq.interventions || []).map((i) => {
    const what = (i.coordinates || []).join(',') || (i.hook ? `${i.hook}${i.positions && i.positions.length ? '@' + i.positions.join(',') : ''}` : '') ||
        (i.layer ? `L${i.layer}H${i.head || 1}` : '');
    return `${short(i.op, 'OP_').toLowerCase()} ${what}`.trim();
  });
  if (rq.patch && (rq.patch.hooks || []).length) edits.push(`patch sweep over ${rq.patch.hooks.join(', ')}`);
  return `${edits.join('; ') || '(no edit)'} · step ${rq.step} · ${rq.n_eval} sequences per set`;
}

// The patch sweep of one evaluation set as a heatmap: hooks (rows) x
// positions (columns), the normalised effect on the logit difference (or
// the loss), white 0 to blue 1.
function patchHeat(effect) {
  const sites = effect.patch || [];
  const hooks = [...new Set(sites.map((p) => p.hook))];
  const positions = [...new Set(sites.map((p) => Number(p.position)))].sort((a, b) => a - b);
  const value = (p) => (effect.has_logit_diff ? p.effect_logit_diff : p.effect_loss);
  return h('table', {class: 'heat patch'},
           h('thead', {}, h('tr', {}, h('th', {}, `${effect.eval_set}: hook \\ position`),
                            positions.map((q) => h('th', {}, q < 0 ? 'all' : q)))),
           h('tbody', {}, hooks.map((hook) => h('tr', {}, h('th', {}, hook), positions.map((q) => {
             const p = sites.find((x) => x.hook === hook && Number(x.position) === q);
             const v = p ? value(p) : null;
             const t = v === null ? 0 : Math.max(0, Math.min(1, v));
             const bg = `rgb(${Math.round(255 - 215 * t)},${Math.round(255 - 170 * t)},${Math.round(255 - 56 * t)})`;
             return h('td', {class: 'cell', style: `background:${bg}`, title: p ? `loss ${fmt(p.loss)}, accuracy ${fmt(p.accuracy)}` : ''},
                      v === null ? '' : fmt(v));
           })))));
}

function interventionCard(item) {
  const rs = item.response, rq = item.request;
  const effects = rs.effects || [];
  const rows = effects.map((e) => h('tr', {}, h('td', {}, e.eval_set),
    h('td', {class: 'num'}, fmt(e.accuracy_clean)), h('td', {class: 'num'}, fmt(e.accuracy)),
    h('td', {class: 'num'}, fmt(e.loss_clean)), h('td', {class: 'num'}, fmt(e.loss)), h('td', {class: 'num'}, fmt(e.kl_clean)),
    h('td', {class: 'num'}, e.has_logit_diff ? `${fmt(e.logit_diff_clean)} → ${fmt(e.logit_diff)}` : '')));
  const card = h('div', {class: 'chart intervention'},
    h('h3', {}, describeRequest(rq)),
    h('table', {class: 'grid effects'},
      h('thead', {}, h('tr', {}, ['set', 'acc clean', 'acc', 'loss clean', 'loss', 'KL', 'logit diff'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows)));
  for (const e of effects) {
    if ((e.patch || []).length) card.append(patchHeat(e));
    if ((e.positions || []).length > 1) {
      const box = h('div');
      card.append(box);
      new Chart(box, `${describeRequest(rq)} · ${e.eval_set} per position`, {logY: false, smooth: 0, xLabel: 'position'}).set([
        {label: 'loss clean', xs: e.positions.map((p) => Number(p.position)), ys: e.positions.map((p) => p.loss_clean)},
        {label: 'loss', xs: e.positions.map((p) => Number(p.position)), ys: e.positions.map((p) => p.loss)},
      ]);
    }
  }
  return card;
}

// #/run/{id}/interventions: every stored Intervene answer of the run (its
// request, clean vs intervened metrics per evaluation set, per-position
// effects, patch sweeps as hook x position heatmaps), and a form that runs a
// new ablation for a caller who may start analyses (POST
// /api/v1/runs/{id}/interventions; a reader's is refused).
function interventionsView(id) {
  const head = h('div'), form = h('div', {id: 'intervene-form'}), status = h('p', {class: 'muted', id: 'intervene-status'});
  const list = h('div', {id: 'interventions'});
  let stopped = false;
  window.__interventions = {state: 'loading', count: 0};

  async function loadList() {
    const r = await api(`/api/v1/runs/${encodeURIComponent(id)}/interventions`);
    list.replaceChildren(...(r.interventions || []).map(interventionCard));
    if (!(r.interventions || []).length) list.replaceChildren(h('p', {class: 'muted'}, 'no intervention stored for this run yet'));
    window.__interventions = {state: 'done', count: (r.interventions || []).length,
                              first: (r.interventions || [])[0] || null};
  }

  function buildForm(run) {
    const imir = !(run.spec && run.spec.model && run.spec.model.decoder);
    const op = h('select', {id: 'intervene-op'}, imir ?
      [h('option', {value: 'zero'}, 'zero coordinates'), h('option', {value: 'ablate'}, 'ablate a head')] :
      [h('option', {value: 'json'}, 'a request as JSON')]);
    const target = h('input', {id: 'intervene-target', value: imir ? 'beta' : '', size: 30,
                               placeholder: imir ? 'alpha, beta, gamma, delta or a label; or the layer (1..L)' : ''});
    const sets = h('input', {id: 'intervene-sets', value: '', size: 24, placeholder: 'all sets'});
    const json = h('textarea', {id: 'intervene-json', rows: 6, cols: 80});
    const requestOf = () => {
      if (op.value === 'json') return JSON.parse(json.value || '{}');
      const rq = {eval_sets: sets.value.split(',').map((x) => x.trim()).filter(Boolean)};
      rq.interventions = op.value === 'zero' ?
          [{op: 'OP_ZERO_COORDINATE', coordinates: target.value.split(',').map((x) => x.trim()).filter(Boolean)}] :
          [{op: 'OP_ABLATE_HEAD', layer: Number(target.value) || 1}];
      return rq;
    };
    const sync = () => {
      if (op.value !== 'json') json.value = JSON.stringify(requestOf(), null, 1);
    };
    [op, target, sets].forEach((el) => el.addEventListener('input', sync));
    op.addEventListener('change', sync);
    if (!imir) json.value = JSON.stringify({interventions: [{op: 'OP_ZERO', hook: 'post_mlp', layer: 0}]}, null, 1);
    const run_ = h('button', {id: 'intervene-run', type: 'button'}, 'Run');
    run_.addEventListener('click', async () => {
      let body;
      try {
        body = op.value === 'json' || json.dataset.edited ? JSON.parse(json.value) : requestOf();
      } catch (e) {
        status.replaceChildren(errorBox('the request is not JSON: ' + e.message));
        return;
      }
      run_.disabled = true;
      try {
        for (;;) {
          const r = await apiPost(`/api/v1/runs/${encodeURIComponent(id)}/interventions`, body);
          if (stopped) return;
          if (r.state === 'ANALYSIS_STATE_QUEUED' || r.state === 'ANALYSIS_STATE_RUNNING') {
            status.textContent = `${short(r.state, 'ANALYSIS_STATE_').toLowerCase()} (job ${r.job_id}): ` +
                `${Math.round(100 * (r.progress || 0))}%`;
            await sleep(600);
            continue;
          }
          if (r.state !== 'ANALYSIS_STATE_DONE') throw new Error(r.error || r.state);
          status.textContent = `done${r.from_store ? ' (stored)' : ''}: step ${r.step}`;
          break;
        }
        await loadList();
      } catch (e) {
        status.replaceChildren(errorBox(e));
        window.__interventions.error = e instanceof ApiError ? e.status : String(e);
      } finally {
        run_.disabled = false;
      }
    });
    json.addEventListener('input', () => (json.dataset.edited = '1'));
    form.replaceChildren(h('h3', {}, 'Run an intervention'),
      h('div', {class: 'filters'}, h('label', {}, 'edit ', op), imir ? h('label', {}, 'on ', target) : '',
        h('label', {}, 'evaluation sets ', sets), run_),
      h('details', {}, h('summary', {}, 'the request as JSON (InterveneRequest; edit for hook-point ops, patches, ' +
                                        'attention masses: examples/intervene_*.json)'), json));
    sync();
  }

  (async () => {
    try {
      const run = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
      head.replaceChildren(h('h2', {}, `${run.run_id} · ${run.name || ''} · interventions`),
                           h('p', {}, h('a', {href: `#/run/${id}`}, 'back to the run')));
      const who = await api('/api/v1/whoami').catch(() => null);
      if (who && who.role && /reader/i.test(who.role)) {
        form.replaceChildren(h('p', {class: 'muted'}, 'your role reads stored interventions only'));
      } else {
        buildForm(run);
      }
      await loadList();
    } catch (e) {
      status.replaceChildren(errorBox(e));
      window.__interventions = {state: 'error'};
    }
  })();
  $view.replaceChildren(head, form, status, list);
  return () => {
    stopped = true;
  };
}

// ---------------------------------------------------------- reproductions ---

const outcomeName = (o) => short(o, 'CHECK_OUTCOME_');
const reproState = (s) => short(s, 'REPRODUCTION_STATE_');
const reproEnded = (s) => ['DONE', 'FAILED', 'CANCELLED'].includes(reproState(s));

// #/reproductions: the server's recipes and the reproductions so far.
function reproductionsView() {
  let stopped = false, timer = null;
  const body = h('div', {});
  async function load() {
    let recipes, list;
    try {
      [recipes, list] = await Promise.all([api('/api/v1/recipes'), api('/api/v1/reproductions')]);
    } catch (e) {
      body.replaceChildren(errorBox(e));
      return;
    }
    const reps = list.reproductions || [];
    const cmd = (r) => `circuitlab reproduce run ${r.id} --scale ${(r.scales || [])[0] || 'ci'}`;
    body.replaceChildren(
        h('h2', {}, 'Reproductions'),
        reps.length ? h('table', {class: 'grid', id: 'reproductions'},
                        h('thead', {}, h('tr', {}, ['id', 'claim', 'scale', 'seeds', 'state', 'progress', 'passed',
                                                    'failed', 'inconclusive', 'phase'].map((c) => h('th', {}, c)))),
                        h('tbody', {}, reps.map((r) => {
                          const rep = r.report || {};
                          return h('tr', {'data-reproduction': r.reproduction_id},
                                   h('td', {}, h('a', {href: `#/reproduction/${r.reproduction_id}`}, r.reproduction_id)),
                                   h('td', {}, `${r.recipe_id} ${r.title || ''}`), h('td', {}, r.scale),
                                   h('td', {class: 'num'}, r.seeds), h('td', {}, reproState(r.state)),
                                   h('td', {class: 'num'}, `${Math.round(100 * (r.progress || 0))}%`),
                                   h('td', {class: 'num pass'}, rep.passed || 0),
                                   h('td', {class: 'num fail'}, rep.failed || 0),
                                   h('td', {class: 'num'}, rep.inconclusive || 0), h('td', {class: 'muted'}, r.phase));
                        }))) :
                      h('p', {class: 'muted'}, 'None yet: start one with the command beside a recipe below.'),
        h('h3', {}, 'Recipes'),
        h('table', {class: 'grid', id: 'recipes'},
          h('thead', {}, h('tr', {}, ['claim', 'title', 'scales (estimated CPU-hours)', 'start'].map((c) => h('th', {}, c)))),
          h('tbody', {}, (recipes.recipes || []).map((r) => h('tr', {}, h('td', {}, r.id), h('td', {title: r.claim}, r.title),
                                                                 h('td', {}, (r.scales || []).map((s) => `${s} ~${fmt((r.estimated_cpu_hours || {})[s] || 0)} h`).join(', ')),
                                                                 h('td', {}, h('code', {}, cmd(r))))))));
    if (!stopped && reps.some((r) => !reproEnded(r.state))) timer = setTimeout(load, 3000);
  }
  $view.replaceChildren(body);
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// A label map of one seed of a report table (two axes besides the seed),
// coloured by label; the y axis grows upward.
function labelMap(table, col, seed, seedAxis, labels) {
  const axes = (table.axes || []).map((a, i) => i).filter((i) => i !== seedAxis);
  const [ax, ay] = axes;
  const rows = (table.rows || []).filter((r) => seedAxis < 0 || r.swept[seedAxis] === seed);
  const xs = [...new Set(rows.map((r) => r.swept[ax]))].sort((a, b) => a - b);
  const ys = [...new Set(rows.map((r) => r.swept[ay]))].sort((a, b) => a - b);
  const at = new Map(rows.map((r) => [valueKey([r.swept[ax], r.swept[ay]]), r]));
  return h('div', {class: 'label-map'},
           h('h4', {}, `${table.columns[col]}, seed ${seed}`),
           h('table', {class: 'heat'},
             h('thead', {}, h('tr', {}, h('th', {}, `${table.axes[ay]} \\ ${table.axes[ax]}`), xs.map((x) => h('th', {}, fmt(x))))),
             h('tbody', {}, ys.slice().reverse().map((y) => h('tr', {}, h('th', {}, fmt(y)), xs.map((x) => {
               const r = at.get(valueKey([x, y]));
               const v = r ? r.values[col] : null;
               const bg = typeof v === 'string' ? PALETTE[labels.indexOf(v) % PALETTE.length] : '#f0f0f0';
               return h('td', {class: 'cell', style: `background:${bg}`, 'data-value': v === null ? '' : String(v)},
                        r ? h('a', {href: `#/run/${r.run_id}`, style: `color:${textOn(bg.startsWith('#') ? hexToRgb(bg) : bg)}`,
                                    title: `${r.run_id} · ${v === null ? 'none' : v}`}, v === null ? '–' : v) : '');
             }))))),
           h('div', {class: 'legend'}, labels.filter((t) => rows.some((r) => r.values[col] === t))
                                             .map((t) => h('span', {}, h('i', {style: `background:${PALETTE[labels.indexOf(t) % PALETTE.length]}`}), t))));
}

// A chart of a series column ([[step, value], ...] per run): one line per row.
function seriesChart(name, table, col, holder) {
  const rows = (table.rows || []).filter((r) => Array.isArray(r.values[col]) && r.values[col].length);
  if (!rows.length) return;
  const steps = [...new Set(rows.flatMap((r) => r.values[col].map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(steps.map((s, i) => [s, i]));
  const data = [steps];
  for (const r of rows) {
    const ys = new Array(steps.length).fill(null);
    for (const [s, v] of r.values[col]) ys[index.get(s)] = v;
    data.push(ys);
  }
  const title = `${name} · ${table.columns[col]}`;
  const el = h('div', {class: 'chart'});
  holder.append(el);
  const label = (r) => [r.run_id].concat((table.axes || []).map((a, i) => `${a}=${fmt(r.swept[i])}`)).join(' ');
  window.__charts[title] = new uPlot({
    title, width: Math.min(900, holder.clientWidth || 900), height: 260,
    series: [{label: 'step'}].concat(rows.map((r, i) => ({label: label(r), stroke: PALETTE[i % PALETTE.length], spanGaps: true}))),
    axes: [{label: 'step'}, {}],
  }, data, el);
}

// A numeric column against the table's one axis besides the seed (E.5's N,
// E.16's kappa): one line per seed, as the papers draw these claims.
function axisChart(name, table, col, axis, seedAxis, holder) {
  const rows = (table.rows || []).filter((r) => typeof r.values[col] === 'number');
  if (rows.length < 2) return;
  const xs = [...new Set(rows.map((r) => r.swept[axis]))].filter((x) => typeof x === 'number').sort((a, b) => a - b);
  if (xs.length < 2) return;
  const seeds = [...new Set(rows.map((r) => seedAxis >= 0 ? r.swept[seedAxis] : 0))].sort((a, b) => a - b);
  const data = [xs];
  for (const seed of seeds) {
    const at = new Map(rows.filter((r) => seedAxis < 0 || r.swept[seedAxis] === seed).map((r) => [r.swept[axis], r.values[col]]));
    data.push(xs.map((x) => at.has(x) ? at.get(x) : null));
  }
  const title = `${name} · ${table.columns[col]} by ${table.axes[axis]}`;
  const el = h('div', {class: 'chart'});
  holder.append(el);
  window.__charts[title] = new uPlot({
    title, width: Math.min(900, holder.clientWidth || 900), height: 240,
    series: [{label: table.axes[axis]}].concat(seeds.map((seed, i) => ({
      label: seedAxis >= 0 ? `seed ${fmt(seed)}` : table.columns[col], stroke: PALETTE[i % PALETTE.length], spanGaps: true,
      points: {show: true, size: 6}}))),
    scales: {x: {time: false}},
    axes: [{label: table.axes[axis]}, {}],
  }, data, el);
}

// Each check's margin per seed, (value - threshold) / max(|value|,
// |threshold|) turned so that the passing side is right of the line
// (equality and "contains" checks sit at the ends), as the Python package's
// plot_reproduction draws it.
const DIRECTION = {COMPARISON_GE: 1, COMPARISON_GT: 1, COMPARISON_LE: -1, COMPARISON_LT: -1};
function marginStrip(checks, comparisons) {
  const W = 640, left = 190, rowH = 18, H = 30 + rowH * checks.length;
  const [svg, add] = svgCanvas(W, H, 'margins');
  const x = (m) => left + (W - left - 20) * (m + 1) / 2;
  add('line', {x1: x(0), x2: x(0), y1: 4, y2: H - 22, stroke: '#555'});
  add('text', {x: x(-1), y: H - 6, 'font-size': 11, fill: '#666'}, 'fails');
  add('text', {x: x(1) - 34, y: H - 6, 'font-size': 11, fill: '#666'}, 'passes');
  checks.forEach((c, row) => {
    const y = 14 + row * rowH;
    add('text', {x: 4, y: y + 4, 'font-size': 12}, c.id);
    const values = c.values || [], against = c.against || [], passed = c.passed || [];
    values.forEach((v, k) => {
      const a = against[k], sign = DIRECTION[comparisons[c.id]] || 0;
      let m;
      if (v === null || v === undefined) m = 0;
      else if (typeof v === 'number' && typeof a === 'number' && sign)
        m = Math.max(-1, Math.min(1, sign * (v - a) / Math.max(Math.abs(v), Math.abs(a), 1e-12)));
      else m = passed[k] ? 1 : -1;
      const colour = v === null || v === undefined ? '#999' : passed[k] ? '#00805a' : '#c0392b';
      const dot = add('circle', {cx: x(m), cy: y + (k - (values.length - 1) / 2) * 4, r: 4, fill: colour,
                                 'data-passed': String(!!passed[k])});
      const t = document.createElementNS('http://www.w3.org/2000/svg', 'title');
      t.textContent = `${c.id}, seed ${k + 1}: ${fmt(v)} against ${fmt(a)}`;
      dot.append(t);
    });
  });
  return svg;
}

// #/reproduction/{id}: the claim, the checks per seed with their outcome, and
// the figures drawn from the report's tables (label maps, series).
function reproductionView(id) {
  let stopped = false, timer = null;
  const body = h('div', {});
  async function load() {
    let r;
    try {
      r = await api(`/api/v1/reproductions/${encodeURIComponent(id)}`);
    } catch (e) {
      body.replaceChildren(errorBox(e));
      return;
    }
    const recipe = r.recipe || {}, rep = r.report || {};
    const scale = (recipe.scales || {})[r.scale] || {};
    const head = [
      h('h2', {}, `${r.reproduction_id}: ${r.recipe_id} ${r.title || ''}`),
      h('p', {}, recipe.claim || ''), h('p', {class: 'muted'}, recipe.source || ''),
      h('p', {}, h('b', {}, `scale ${r.scale}`), `, ${r.seeds} seed(s). ${scale.note || ''}`),
      h('p', {id: 'reproduction-state'}, h('b', {}, reproState(r.state)),
        ` ${Math.round(100 * (r.progress || 0))}% · ${r.phase || ''}`, r.error ? h('span', {class: 'fail'}, ' ' + r.error) : ''),
    ];
    if (reproState(r.state) !== 'DONE') {
      body.replaceChildren(...head, h('p', {}, h('a', {href: '#/reproductions'}, 'all reproductions')));
      if (!stopped && !reproEnded(r.state)) timer = setTimeout(load, 3000);
      return;
    }
    const checks = h('table', {class: 'grid', id: 'checks'},
                     h('thead', {}, h('tr', {}, ['check', 'expected', 'measured (per seed)', 'outcome', 'note'].map((c) => h('th', {}, c)))),
                     h('tbody', {}, (rep.checks || []).map((c) => h('tr', {'data-outcome': outcomeName(c.outcome)},
                       h('td', {title: c.description}, h('b', {}, c.id), h('div', {class: 'muted'}, c.description)),
                       h('td', {}, c.expected),
                       h('td', {class: 'num'}, (c.values || []).map((v) => Array.isArray(v) ? `[${v.length}]` : fmt(v)).join(', ')),
                       h('td', {class: outcomeName(c.outcome) === 'PASS' ? 'pass' : outcomeName(c.outcome) === 'FAIL' ? 'fail' : 'muted'},
                         outcomeName(c.outcome)),
                       h('td', {class: 'muted'}, c.note || '')))));
    const figures = h('div', {id: 'figures'});
    body.replaceChildren(...head,
                         h('p', {}, `${rep.passed || 0} passed, ${rep.failed || 0} failed, ${rep.inconclusive || 0} inconclusive; ${fmt(rep.wall_seconds || 0)} s`),
                         checks, (rep.notes || []).length ? h('ul', {}, rep.notes.map((n) => h('li', {class: 'muted'}, n))) : '',
                         h('h3', {}, 'Figures'), figures);
    const comparisons = Object.fromEntries((scale.checks || []).map((c) => [c.id, c.comparison || 'COMPARISON_GE']));
    figures.append(h('div', {class: 'figure', 'data-table': 'margins'}, h('h4', {}, 'each check\'s margin per seed'),
                     marginStrip(rep.checks || [], comparisons)));
    // In the recipe's order (the experiment the claim is about comes first).
    const order = (scale.sweeps || []).map((sw) => sw.name);
    const rank = (n) => (order.indexOf(n) + order.length + 1) % (order.length + 1);
    for (const [name, table] of Object.entries(rep.tables || {}).sort((a, b) => rank(a[0]) - rank(b[0]))) {
      const seedAxis = (table.axes || []).indexOf('seed');
      const others = (table.axes || []).length - (seedAxis >= 0 ? 1 : 0);
      const seeds = [...new Set((table.rows || []).map((r) => seedAxis >= 0 ? r.swept[seedAxis] : 0))].sort((a, b) => a - b);
      const box = h('div', {class: 'figure', 'data-table': name}, h('h4', {}, `${name} (${table.sweep_id})`));
      figures.append(box);
      // One colour per label across the table's maps (pair and pair_predicted agree).
      const labels = [...new Set((table.rows || []).flatMap((r) => r.values).filter((v) => typeof v === 'string'))].sort();
      (table.columns || []).forEach((c, col) => {
        const cells = (table.rows || []).map((r) => r.values[col]);
        if (others === 2 && cells.some((v) => typeof v === 'string')) {
          for (const seed of seeds) box.append(labelMap(table, col, seed, seedAxis, labels));
        } else if (cells.some((v) => Array.isArray(v) && v.length && Array.isArray(v[0]))) {
          seriesChart(name, table, col, box);
        } else if (others === 1 && cells.some((v) => typeof v === 'number')) {
          axisChart(name, table, col, (table.axes || []).findIndex((a, i) => i !== seedAxis), seedAxis, box);
        }
      });
      box.append(h('details', {}, h('summary', {}, `the data: ${(table.rows || []).length} runs`), h('div', {class: 'scroll'}, h('table', {class: 'grid'},
        h('thead', {}, h('tr', {}, h('th', {}, 'run'), (table.axes || []).map((a) => h('th', {}, a)),
                         (table.columns || []).map((c) => h('th', {}, c)))),
        h('tbody', {}, (table.rows || []).map((r) => h('tr', {}, h('td', {}, h('a', {href: `#/run/${r.run_id}`}, r.run_id)),
          (r.swept || []).map((v) => h('td', {}, fmt(v))),
          (r.values || []).map((v) => h('td', {class: 'num'}, Array.isArray(v) ? `[${v.length}]` : fmt(v))))))))));
    }
  }
  $view.replaceChildren(body);
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// --------------------------------------------------------------- router ---

let cleanup = () => {};
function route() {
  cleanup();
  window.__charts = {};
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, qs] = hash.split('?');
  const params = new URLSearchParams(qs || '');
  const parts = path.split('/').filter(Boolean);
  if (parts[0] === 'run' && parts[1] && parts[2] === 'attention')
    cleanup = attentionView(parts[1], params);
  else if (parts[0] === 'run' && parts[1] && parts[2] === 'circuit')
    cleanup = circuitView(parts[1], params);
  else if (parts[0] === 'run' && parts[1] && parts[2] === 'interventions')
    cleanup = interventionsView(parts[1]);
  else if (parts[0] === 'run' && parts[1])
    cleanup = runView(parts[1]);
  else if (parts[0] === 'sweep' && parts[1])
    cleanup = sweepView(parts[1], params);
  else if (parts[0] === 'compare')
    cleanup = compareView(params);
  else if (parts[0] === 'reproductions')
    cleanup = reproductionsView();
  else if (parts[0] === 'reproduction' && parts[1])
    cleanup = reproductionView(parts[1]);
  else
    cleanup = runsView(params);
}
window.addEventListener('hashchange', route);
api('/api/v1/whoami')
    .then((w) => {
      document.getElementById('who').textContent = `${w.principal} (${w.role})${w.tls ? ' · TLS' : ''}`;
    })
    .catch(() => {});
route();
