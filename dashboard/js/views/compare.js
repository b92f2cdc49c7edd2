// Compare (#/compare?runs=...): several runs' series overlaid.
import {api} from '../api.js';
import {Chart, chartControls, smooth} from '../charts.js';
import {$view, h, query} from '../util.js';

export function compareView(params) {
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
