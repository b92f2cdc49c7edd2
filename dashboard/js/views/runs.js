// The runs table (#/): filter, columns, states.
import {api, errorBox} from '../api.js';
import {withTableDownloads} from '../downloads.js';
import {$view, FINAL, fmt, h, query, stateName, when} from '../util.js';

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

export function runsView(params) {
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
      h('h2', {}, 'Runs'), h('div', {class: 'filters'}, stateSel, tagIn, sweepIn, colIn, status),
      withTableDownloads(table, 'runs'));
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
