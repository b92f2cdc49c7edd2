// Compare (#/compare?runs=...&series=...): up to 20 runs side by side: the
// fields of their specs that differ, one chart per series with the runs
// named by id, name and their differing fields, the series' last values.
import {api} from '../api.js';
import {Chart, chartControls} from '../charts.js';
import {withTableDownloads} from '../downloads.js';
import {$view, fmt, h, query} from '../util.js';

export const MAX_COMPARED = 20;

// {"a.b[0].c": value} of every leaf of a spec (as GET /runs/{id} answers it).
export function flatten(v, prefix = '', out = {}) {
  if (Array.isArray(v)) {
    if (!v.length) out[prefix] = '[]';
    v.forEach((x, i) => flatten(x, `${prefix}[${i}]`, out));
  } else if (v && typeof v === 'object') {
    const keys = Object.keys(v);
    if (!keys.length && prefix) out[prefix] = '{}';
    for (const k of keys) flatten(v[k], prefix ? `${prefix}.${k}` : k, out);
  } else {
    out[prefix] = v;
  }
  return out;
}

// The paths whose values are not the same in every run (a path one run
// lacks differs), in the order of the first run's spec.
export function differingFields(specs) {
  const flat = specs.map((s) => flatten(s || {}));
  const paths = [...new Set(flat.flatMap((f) => Object.keys(f)))];
  return paths.filter((p) => new Set(flat.map((f) => JSON.stringify(f[p] === undefined ? null : f[p]))).size > 1)
      .map((p) => ({path: p, values: flat.map((f) => f[p])}));
}

export function compareView(params) {
  const opts = {logY: false, smooth: 0};
  const runsIn = h('input', {id: 'cmp-runs', value: params.get('runs') || '', size: 40, placeholder: 'r1,r2,r3'});
  const seriesIn = h('input', {
    id: 'cmp-series',
    value: params.get('series') || 'train/loss',
    size: 40,
    placeholder: 'metrics or coord:<name>, comma-separated'
  });
  const charts = h('div', {class: 'charts'});
  const status = h('p', {class: 'muted', id: 'cmp-status'});
  const diffBox = h('div', {id: 'cmp-diff'});
  let drawn = [];
  window.__compare = {state: 'loading'};

  async function seriesOf(rid, name) {
    const coord = name.startsWith('coord:') ? name.slice(6) : null;
    const t = coord ? await api(`/api/v1/runs/${rid}/coordinates` + query({names: coord, max_points: 2000})) :
                      await api(`/api/v1/runs/${rid}/metrics` + query({names: name, max_points: 2000}));
    return (t.series || [])[0] || null;
  }

  async function load() {
    let ids = runsIn.value.split(',').map((s) => s.trim()).filter(Boolean);
    const names = seriesIn.value.split(',').map((s) => s.trim()).filter(Boolean);
    history.replaceState(null, '', '#/compare' + query({runs: ids.join(','), series: names.join(',')}));
    if (!ids.length || !names.length) {
      status.textContent = 'Name some runs and one or more metrics (or coord:<name>).';
      return;
    }
    const notes = [];
    if (ids.length > MAX_COMPARED) {
      notes.push(`showing the first ${MAX_COMPARED} of ${ids.length} runs`);
      ids = ids.slice(0, MAX_COMPARED);
    }
    const runs = await Promise.all(ids.map((rid) => api(`/api/v1/runs/${encodeURIComponent(rid)}`).catch((e) => {
      notes.push(`${rid}: ${e.message}`);
      return null;
    })));
    const found = runs.filter(Boolean);
    const diff = differingFields(found.map((r) => r.spec));
    // A run's legend: its id, name and the fields that tell it apart (the
    // last part of each path, at most three).
    const labelOf = (r, i) => {
      const own = diff.filter((d) => d.path !== 'name').slice(0, 3).map((d) => `${d.path.split('.').pop()}=${fmt(d.values[i])}`);
      return [r.run_id, r.name, own.join(' ')].filter(Boolean).join(' · ');
    };
    const legends = new Map(found.map((r, i) => [r.run_id, labelOf(r, i)]));

    const last = {};  // series -> run -> its last value
    for (const c of drawn) c.plot && c.plot.destroy();
    charts.replaceChildren();
    drawn = [];
    for (const name of names) {
      const list = [];
      last[name] = {};
      await Promise.all(found.map(async (r) => {
        try {
          const s = await seriesOf(r.run_id, name);
          if (!s) {
            notes.push(`no ${name} for ${r.run_id}`);
            return;
          }
          list.push({id: r.run_id, label: legends.get(r.run_id), xs: s.steps.map(Number), ys: s.values});
          last[name][r.run_id] = s.values[s.values.length - 1];
        } catch (e) {
          notes.push(`${r.run_id} ${name}: ${e.message}`);
        }
      }));
      list.sort((a, b) => ids.indexOf(a.id) - ids.indexOf(b.id));
      const chart = new Chart(charts, name, opts, {yLabel: name});
      chart.set(list);
      drawn.push(chart);
    }

    // The spec fields that differ, and the series' last values, run by run.
    const head = h('tr', {}, h('th', {}, 'field'), found.map((r) => h('th', {}, `${r.run_id}${r.name ? ' · ' + r.name : ''}`)));
    const rows = diff.map((d) => h('tr', {'data-field': d.path}, h('th', {}, d.path),
                                   d.values.map((v) => h('td', {class: 'differs'}, v === undefined ? '(unset)' : fmt(v)))));
    const finals = names.map((n) => h('tr', {'data-series': n}, h('th', {}, `${n} (last)`),
                                      found.map((r) => h('td', {class: 'num'}, fmt(last[n][r.run_id])))));
    const table = h('table', {class: 'grid diff', id: 'cmp-table'}, h('thead', {}, head), h('tbody', {}, rows, finals));
    const box = withTableDownloads(table, 'compare ' + found.map((r) => r.run_id).join(' '));
    const scroll = h('div', {class: 'scroll'});
    table.replaceWith(scroll);  // wide with many runs: it scrolls, the page does not
    scroll.append(table);
    diffBox.replaceChildren(
        h('h3', {}, found.length < 2 ? 'spec' :
                    diff.length ? `${diff.length} spec field(s) differ` : 'the specs are the same'),
        box);
    status.textContent = `${found.length} run(s), ${names.length} series` + (notes.length ? ` · ${notes.join('; ')}` : '');
    window.__compare = {state: 'done', runs: found.map((r) => r.run_id), fields: diff.map((d) => d.path), charts: names};
  }
  runsIn.addEventListener('change', load);
  seriesIn.addEventListener('change', load);
  $view.replaceChildren(
      h('h2', {}, 'Compare'),
      h('div', {class: 'filters'}, h('label', {}, 'runs ', runsIn), h('label', {}, 'series ', seriesIn)),
      chartControls(opts, () => drawn.forEach((c) => {
        c.plot && (c.plot.destroy(), c.plot = null);
        c.draw();
      })),
      status, diffBox, charts);
  load();
  return () => {};
}
