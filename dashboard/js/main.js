// circuitlab dashboard: a single page over the server's JSON API (/api/v1,
// protobuf's JSON mapping with proto field names) and its run event streams.
// ES modules served as they are (no build step); charts are uPlot
// (vendor/uplot). This module is the router: #/path?query -> one view module.
import {api} from './api.js';
import {attentionView} from './views/attention.js';
import {circuitView} from './views/circuit.js';
import {compareView} from './views/compare.js';
import {interventionsView} from './views/interventions.js';
import {reproductionView, reproductionsView} from './views/reproductions.js';
import {runView} from './views/run.js';
import {runsView} from './views/runs.js';
import {sweepView} from './views/sweep.js';

document.getElementById('login-form').addEventListener('submit', (e) => {
  e.preventDefault();
  sessionStorage.setItem('circuitlab-token', document.getElementById('token').value.trim());
  document.getElementById('login').hidden = true;
  route();
});

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
