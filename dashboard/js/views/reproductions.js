// Reproductions (#/reproductions, #/reproduction/ID): the recipes, each claim's checks and figures.
import {api, apiText, errorBox} from '../api.js';
import {hexToRgb, svgCanvas, textOn} from '../charts.js';
import {csvOf, downloadBar, plotDownloads, saveSvg, saveText, withTableDownloads} from '../downloads.js';
import {$view, PALETTE, fmt, h, short, valueKey} from '../util.js';

const outcomeName = (o) => short(o, 'CHECK_OUTCOME_');

const reproState = (s) => short(s, 'REPRODUCTION_STATE_');

const reproEnded = (s) => ['DONE', 'FAILED', 'CANCELLED'].includes(reproState(s));

// #/reproductions: the server's recipes and the reproductions so far.
export function reproductionsView() {
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
        reps.length ? withTableDownloads(h('table', {class: 'grid', id: 'reproductions'},
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
                        }))), 'reproductions') :
                      h('p', {class: 'muted'}, 'None yet: start one with the command beside a recipe below.'),
        h('h3', {}, 'Recipes'),
        withTableDownloads(h('table', {class: 'grid', id: 'recipes'},
          h('thead', {}, h('tr', {}, ['claim', 'title', 'scales (estimated CPU-hours)', 'start'].map((c) => h('th', {}, c)))),
          h('tbody', {}, (recipes.recipes || []).map((r) => h('tr', {}, h('td', {}, r.id), h('td', {title: r.claim}, r.title),
                                                                 h('td', {}, (r.scales || []).map((s) => `${s} ~${fmt((r.estimated_cpu_hours || {})[s] || 0)} h`).join(', ')),
                                                                 h('td', {}, h('code', {}, cmd(r))))))), 'recipes'));
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
  const title = `${table.columns[col]}, seed ${seed}`;
  return h('div', {class: 'label-map'},
           h('h4', {}, title),
           withTableDownloads(h('table', {class: 'heat'},
             h('thead', {}, h('tr', {}, h('th', {}, `${table.axes[ay]} \\ ${table.axes[ax]}`), xs.map((x) => h('th', {}, fmt(x))))),
             h('tbody', {}, ys.slice().reverse().map((y) => h('tr', {}, h('th', {}, fmt(y)), xs.map((x) => {
               const r = at.get(valueKey([x, y]));
               const v = r ? r.values[col] : null;
               const bg = typeof v === 'string' ? PALETTE[labels.indexOf(v) % PALETTE.length] : '#f0f0f0';
               return h('td', {class: 'cell', style: `background:${bg}`, 'data-value': v === null ? '' : String(v)},
                        r ? h('a', {href: `#/run/${r.run_id}`, style: `color:${textOn(bg.startsWith('#') ? hexToRgb(bg) : bg)}`,
                                    title: `${r.run_id} · ${v === null ? 'none' : v}`}, v === null ? '–' : v) : '');
             }))))), title, true),
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
  const u = window.__charts[title] = new uPlot({
    title, width: Math.min(900, holder.clientWidth || 900), height: 260,
    series: [{label: 'step'}].concat(rows.map((r, i) => ({label: label(r), stroke: PALETTE[i % PALETTE.length], spanGaps: true}))),
    axes: [{label: 'step'}, {}],
  }, data, el);
  el.prepend(plotDownloads(title, u));
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
  const u = window.__charts[title] = new uPlot({
    title, width: Math.min(900, holder.clientWidth || 900), height: 240,
    series: [{label: table.axes[axis]}].concat(seeds.map((seed, i) => ({
      label: seedAxis >= 0 ? `seed ${fmt(seed)}` : table.columns[col], stroke: PALETTE[i % PALETTE.length], spanGaps: true,
      points: {show: true, size: 6}}))),
    scales: {x: {time: false}},
    axes: [{label: table.axes[axis]}, {}],
  }, data, el);
  el.prepend(plotDownloads(title, u));
}

// Bars of a report table's numeric columns: each the seeds' mean, each seed
// a dot (a recipe figure of KIND_BARS).
function barsFigure(table, cols, legend) {
  const W = 640, H = 240, left = 48, bottom = 54, top = 10;
  const [svg, add] = svgCanvas(W, H, '');
  svg.classList.add('bars');
  const values = cols.map((col) => (table.rows || []).map((r) => r.values[col]).filter((v) => typeof v === 'number' && Number.isFinite(v)));
  const all = values.flat().concat([0]);
  const lo = Math.min(...all), hi = Math.max(...all);
  const y = (v) => top + (H - top - bottom) * (hi === lo ? 0.5 : (hi - v) / (hi - lo));
  const slot = (W - left - 10) / Math.max(1, cols.length);
  add('line', {x1: left, x2: W - 10, y1: y(0), y2: y(0), stroke: '#555'});
  for (const t of [lo, hi]) add('text', {x: 2, y: y(t) + 4, 'font-size': 10, fill: '#666'}, fmt(t));
  values.forEach((vs, j) => {
    const x0 = left + j * slot + slot * 0.15, w = slot * 0.7;
    if (vs.length) {
      const mean = vs.reduce((a, b) => a + b, 0) / vs.length;
      add('rect', {x: x0, y: Math.min(y(mean), y(0)), width: w, height: Math.abs(y(mean) - y(0)),
                   fill: PALETTE[j % PALETTE.length], opacity: 0.6, 'data-mean': String(mean)});
      vs.forEach((v) => add('circle', {cx: x0 + w / 2, cy: y(v), r: 3, fill: '#222'}));
    }
    add('text', {x: x0, y: H - bottom + 14 + (j % 2) * 12, 'font-size': 10}, legend[j]);
  });
  return svg;
}

// The paper's figures the recipe names (RecipeScale.figures), from the
// report's tables.
function recipeFigure(f, i, rep) {
  const box = h('div', {class: 'figure paper-figure', 'data-figure': String(i)}, h('h4', {}, f.title || `figure ${i + 1}`));
  const table = (rep.tables || {})[f.sweep];
  if (!table) return box;
  const kind = short(f.kind, 'KIND_');
  const seedAxis = (table.axes || []).indexOf('seed');
  const seeds = [...new Set((table.rows || []).map((r) => seedAxis >= 0 ? r.swept[seedAxis] : 0))].sort((a, b) => a - b);
  const cols = (f.columns || []).map((c) => (table.columns || []).indexOf(c)).filter((c) => c >= 0);
  const legend = (f.columns || []).map((c, j) => (f.legend || [])[j] || c);
  if (kind === 'LABEL_MAP' && cols.length) {
    const labels = [...new Set((table.rows || []).map((r) => r.values[cols[0]]).filter((v) => typeof v === 'string'))].sort();
    for (const seed of seeds) box.append(labelMap(table, cols[0], seed, seedAxis, labels));
  } else if (kind === 'SERIES') {
    // A list of numbers is drawn against its index, as [index, value] pairs.
    const pairs = {...table, rows: (table.rows || []).map((r) => ({...r, values: r.values.map((v) =>
      Array.isArray(v) && v.length && typeof v[0] === 'number' ? v.map((y, k) => [k, y]) : v)}))};
    for (const col of cols) seriesChart(f.title, pairs, col, box);
  } else if (kind === 'CURVE') {
    const axis = (table.axes || []).indexOf(f.x);
    if (axis >= 0) for (const col of cols) axisChart(f.title, table, col, axis, seedAxis, box);
  } else if (kind === 'BARS') {
    const svg = barsFigure(table, cols, legend);
    box.append(downloadBar({
      SVG: () => saveSvg(svg, f.title || `figure ${i + 1}`),
      CSV: () => saveText(`${f.title || 'figure'}.csv`.replace(/[^A-Za-z0-9_.-]+/g, '-'),
                          csvOf([['run'].concat(legend)].concat((table.rows || []).map((r) => [r.run_id].concat(cols.map((c) => r.values[c]))))),
                          'text/csv'),
    }), svg);
  }
  return box;
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
export function reproductionView(id) {
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
    const checks = withTableDownloads(h('table', {class: 'grid', id: 'checks'},
                     h('thead', {}, h('tr', {}, ['check', 'expected', 'measured (per seed)', 'outcome', 'note'].map((c) => h('th', {}, c)))),
                     h('tbody', {}, (rep.checks || []).map((c) => h('tr', {'data-outcome': outcomeName(c.outcome)},
                       h('td', {title: c.description}, h('b', {}, c.id), h('div', {class: 'muted'}, c.description)),
                       h('td', {}, c.expected),
                       h('td', {class: 'num'}, (c.values || []).map((v) => Array.isArray(v) ? `[${v.length}]` : fmt(v)).join(', ')),
                       h('td', {class: outcomeName(c.outcome) === 'PASS' ? 'pass' : outcomeName(c.outcome) === 'FAIL' ? 'fail' : 'muted'},
                         outcomeName(c.outcome)),
                       h('td', {class: 'muted'}, c.note || ''))))), `${r.reproduction_id} ${r.recipe_id} checks`);
    const figures = h('div', {id: 'figures'});
    // The report as the Markdown file of docs/reproductions/ (the server renders it).
    const markdown = downloadBar({Markdown: async () => {
      try {
        const md = await apiText(`/api/v1/reproductions/${encodeURIComponent(id)}/report.md`);
        saveText(`${r.reproduction_id}-${r.recipe_id}.md`, md, 'text/markdown');
      } catch (e) {
        body.prepend(errorBox(e));
      }
    }});
    body.replaceChildren(...head,
                         h('p', {id: 'report-download'}, 'report: ', markdown),
                         h('p', {}, `${rep.passed || 0} passed, ${rep.failed || 0} failed, ${rep.inconclusive || 0} inconclusive${rep.reported ? `, ${rep.reported} reported only` : ''}; ${fmt(rep.wall_seconds || 0)} s`),
                         checks, (rep.notes || []).length ? h('ul', {}, rep.notes.map((n) => h('li', {class: 'muted'}, n))) : '',
                         h('h3', {}, 'Figures'), figures);
    (scale.figures || []).forEach((f, i) => figures.append(recipeFigure(f, i, rep)));
    const comparisons = Object.fromEntries((scale.checks || []).map((c) => [c.id, c.comparison || 'COMPARISON_GE']));
    const strip = marginStrip(rep.checks || [], comparisons);
    figures.append(h('div', {class: 'figure', 'data-table': 'margins'}, h('h4', {}, 'each check\'s margin per seed'),
                     downloadBar({SVG: () => saveSvg(strip, `${r.reproduction_id}-${r.recipe_id}-margins`)}), strip));
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
      box.append(h('details', {}, h('summary', {}, `the data: ${(table.rows || []).length} runs`), h('div', {class: 'scroll'}, withTableDownloads(h('table', {class: 'grid'},
        h('thead', {}, h('tr', {}, h('th', {}, 'run'), (table.axes || []).map((a) => h('th', {}, a)),
                         (table.columns || []).map((c) => h('th', {}, c)))),
        h('tbody', {}, (table.rows || []).map((r) => h('tr', {}, h('td', {}, h('a', {href: `#/run/${r.run_id}`}, r.run_id)),
          (r.swept || []).map((v) => h('td', {}, fmt(v))),
          (r.values || []).map((v) => h('td', {class: 'num'}, Array.isArray(v) ? `[${v.length}]` : fmt(v))))))), `${r.reproduction_id} ${name}`))));
    }
  }
  $view.replaceChildren(body);
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
