// A sweep (#/sweep/ID): its map of one value over the swept axes, and its table.
import {api, errorBox} from '../api.js';
import {colorScale, hexToRgb, textOn} from '../charts.js';
import {withTableDownloads} from '../downloads.js';
import {$view, PALETTE, fmt, h, query, stateName, valueKey} from '../util.js';

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

export function sweepView(id, params) {
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
          withTableDownloads(h('table', {class: 'grid', id: 'members'},
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
                            (r.values || []).map((v) => h('td', {class: 'num'}, fmt(v))))))), `${id} members`)));
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
    const title = `${p.value} by ${p.x} (x) and ${p.y} (y)`;
    heat.replaceChildren(
        h('h3', {}, title),
        withTableDownloads(h('table', {class: 'heat'},
          h('thead', {}, h('tr', {}, h('th', {}, `${p.y} \\ ${p.x}`), xs.map((x) => h('th', {}, fmt(x))))),
          h('tbody', {}, rows)), `${id} ${title}`, true),
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
