// Drives the dashboard in headless chromium as a person would and asserts on
// what is drawn (chart data and painted canvas pixels, not only elements).
//   node dashboard_check.cjs BASE_URL OUT_DIR
// The server has r1, r2 (finished runs; r2 is the README's demo,
// examples/induction.json), s1 = r3..r6 (a finished 2x2 sweep of lr x seed),
// r7 (a finished decoder, examples/dice_task_vectors.json) and r8 training
// live. Screenshots: OUT_DIR/{runs,run,attention,circuit,task-vectors,live,
// sweep,sweep-labels,compare}.png.
'use strict';

const [base, out] = process.argv.slice(2);
const { check, waitFor, openPage, chartStats, finish, main } = require('./browser_util.cjs');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

main(async () => {
  // The deliberate 415 (a POST without a JSON Content-Type) is the one error
  // expected; run event streams end when a page is left.
  const { browser, page, errors } = await openPage((kind, text, request) =>
    (kind === 'console' && text.includes('status of 415')) ||
    (kind === 'response' && text === '415' && request.method() === 'POST') ||
    (kind === 'requestfailed' && text.includes('/events')));

  // ---- runs table ----
  await page.goto(base + '#/');
  await waitFor(page, () => document.querySelectorAll('#runs tr[data-run]').length === 8, null, 'runs table lists 8 runs');
  await waitFor(page, () => {
    const s = document.querySelector('#runs tr[data-run="r8"] .state');
    return s && s.textContent === 'RUNNING';
  }, null, 'the live run shows RUNNING');
  const states = await page.evaluate(() => Object.fromEntries([...document.querySelectorAll('#runs tr[data-run]')]
    .map((tr) => [tr.dataset.run, tr.querySelector('.state').textContent])));
  check(['r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7'].every((r) => states[r] === 'SUCCEEDED') && states.r8 === 'RUNNING',
        `runs table states ${JSON.stringify(states)}`);
  const headers = await page.$$eval('#runs th', (ths) => ths.map((t) => t.textContent));
  check(headers.some((h) => h.startsWith('eval/icl_rare/accuracy')), `metric columns ${headers.slice(7).join(', ')}`);
  await page.select('#f-state', 'succeeded');
  await waitFor(page, () => document.querySelectorAll('#runs tr[data-run]').length === 7, null, 'state filter keeps 7 runs');
  await page.select('#f-state', '');
  await waitFor(page, () => document.querySelectorAll('#runs tr[data-run]').length === 8, null, 'filter cleared');
  await page.screenshot({ path: `${out}/runs.png` });

  // ---- a finished run: curves and coordinates drawn ----
  await page.goto(base + '#/run/r1');
  await waitFor(page, () => ['loss', 'accuracy', 'coordinates'].every((t) => window.__charts[t]), null, 'run page charts');
  for (const title of ['loss', 'accuracy', 'coordinates']) {
    const s = await page.evaluate(chartStats, title);
    check(s && s.series.length > 0 && s.series.every((n) => n >= 3), `${title}: every series has points ${s && JSON.stringify(s.series)}`);
    check(s && s.painted > 2000, `${title}: canvas painted (${s && s.painted} px)`);
  }
  const coords = await page.evaluate(chartStats, 'coordinates');
  check(coords && ['alpha', 'beta', 'gamma', 'delta', 'rho'].every((n) => coords.labels.some((l) => l.startsWith(n))),
        `coordinates α β γ δ and ρ: ${coords && coords.labels.join(' | ')}`);
  await page.click('.filters input[type=checkbox]');  // log y
  await sleep(300);
  const logged = await page.evaluate(chartStats, 'loss');
  check(logged && logged.painted > 2000, 'log-y redraws the loss chart');
  await page.click('.filters input[type=checkbox]');
  await page.screenshot({ path: `${out}/run.png`, fullPage: true });

  // ---- attention patterns of the demo run: a grid of heads, the stripe ----
  await page.goto(base + '#/run/r2');
  await waitFor(page, () => document.getElementById('attention-link'), null, 'the run page links its attention patterns');
  await page.click('#attention-link');
  await waitFor(page, () => window.__attention && window.__attention.state === 'done', null, 'attention patterns drawn', 60000);
  const att = await page.evaluate(() => {
    const a = window.__attention;
    const canvases = [...document.querySelectorAll('#attention-grid canvas')];
    const painted = canvases.map((c) => {
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let i = 0; i < d.length; i += 4) if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) n++;
      return n;
    });
    // The previous-token stripe of the layer-1 head (L1H1, layer index 0):
    // at each block's second position (even t >= 2, the value after its
    // key) the head looks at t - 1. Read from the page's own data.
    const p = a.answer.patterns.find((x) => Number(x.layer || 0) === 0 && Number(x.sequence || 0) === a.sequence);
    let sum = 0, n = 0;
    for (let q = 2; q < p.size; q += 2) { sum += p.weights[q * p.size + q - 1]; n++; }
    return { heads: [...document.querySelectorAll('#attention-grid figure')].map((f) => f.dataset.head), painted,
             step: a.step, steps: Number(document.getElementById('attention-step').max) + 1, stripe: sum / n,
             tokens: a.answer.sequences[a.sequence].tokens.length, size: p.size };
  });
  check(JSON.stringify(att.heads) === '["L1H1","L2H1"]', `one heatmap per head: ${att.heads}`);
  check(att.painted.length === 2 && att.painted.every((n) => n > 500), `heatmaps painted (${att.painted} px)`);
  check(att.step === 600 && att.steps === 3, `newest checkpoint shown, slider over 3 (step ${att.step}, ${att.steps} steps)`);
  check(att.tokens === att.size, `the sequence's ${att.tokens} tokens label the ${att.size} x ${att.size} map`);
  check(att.stripe > 0.5, `L1H1 previous-token stripe: mean weight on t-1 at the blocks' second positions ${att.stripe.toFixed(3)}`);
  const box = await (await page.$('#attention-grid canvas')).boundingBox();
  await page.mouse.move(box.x + box.width - 4, box.y + box.height - 4);  // the last query's last key
  const tip = await page.evaluate(() => !document.getElementById('attention-tip').hidden &&
                                        document.getElementById('attention-tip').textContent);
  check(tip && /query \d+ \(token \d+\) → key \d+/.test(tip), `hover reads a weight: ${tip}`);
  await page.click('#attention-grid canvas');
  await waitFor(page, () => document.querySelector('#attention-zoom canvas'), null, 'a click enlarges the head');
  await page.screenshot({ path: `${out}/attention.png`, fullPage: true });
  await page.evaluate(() => {
    const s = document.getElementById('attention-step');
    s.value = 0;
    s.dispatchEvent(new Event('change'));
  });
  await waitFor(page, () => window.__attention.state === 'done' && window.__attention.step === 200, null,
                'the slider shows the first checkpoint (step 200)', 60000);

  // ---- the demo's circuit: none stored, computed from the page, replayed ----
  await page.goto(base + '#/run/r2/circuit');
  await waitFor(page, () => window.__circuit && window.__circuit.state === 'none', null, 'no circuit stored yet: a button');
  await page.click('#circuit-compute');
  await waitFor(page, () => window.__circuit.state === 'done', null, 'the circuit detected from the page', 120000);
  const circ = await page.evaluate(() => ({ ...window.__circuit, svg: !!document.querySelector('#circuit-graph path.edge'),
                                            steps: Number(document.getElementById('circuit-step').max) + 1 }));
  check(circ.svg && circ.edges >= 3 && circ.template === 'induction_head',
        `circuit graph: ${circ.edges} edges, template ${circ.template}`);
  await page.screenshot({ path: `${out}/circuit.png` });
  const last = circ.widths.reduce((a, b) => a + b, 0);
  await page.evaluate(() => {
    const s = document.getElementById('circuit-step');
    s.value = 1;
    s.dispatchEvent(new Event('input'));
  });
  const early = await page.evaluate(() => window.__circuit.widths.reduce((a, b) => a + b, 0));
  check(circ.steps >= 10 && early < last, `the slider replays the coordinates growing (${circ.steps} steps; ` +
        `edge widths ${early.toFixed(1)} at the second step < ${last.toFixed(1)} at the last)`);

  // ---- interventions: the form runs an ablation, its result is listed ----
  await page.goto(base + '#/run/r2');
  await waitFor(page, () => document.getElementById('interventions-link'), null, 'the run page links its interventions');
  await page.click('#interventions-link');
  await waitFor(page, () => window.__interventions && window.__interventions.state === 'done', null, 'interventions page');
  check(await page.evaluate(() => window.__interventions.count === 0), 'no intervention stored yet');
  await page.select('#intervene-op', 'zero');
  await page.$eval('#intervene-target', (el) => { el.value = 'beta'; el.dispatchEvent(new Event('input')); });
  await page.$eval('#intervene-sets', (el) => { el.value = 'icl_rare,iwl'; el.dispatchEvent(new Event('input')); });
  await page.click('#intervene-run');
  await waitFor(page, () => window.__interventions.count === 1, null, 'the ablation ran and is listed', 120000);
  const abl = await page.evaluate(() => {
    const e = window.__interventions.first.response.effects;
    const set = (n) => e.find((x) => x.eval_set === n);
    return { sets: e.map((x) => x.eval_set), icl: [set('icl_rare').accuracy_clean, set('icl_rare').accuracy],
             iwl: [set('iwl').accuracy_clean, set('iwl').accuracy], rows: document.querySelectorAll('table.effects tbody tr').length,
             title: document.querySelector('.intervention h3').textContent };
  });
  check(abl.rows === 2 && abl.icl[1] < abl.icl[0] - 0.1 && Math.abs(abl.iwl[1] - abl.iwl[0]) < 0.05,
        `zeroing beta: icl_rare ${abl.icl.map((v) => v.toFixed(3)).join(' -> ')}, iwl ${abl.iwl.map((v) => v.toFixed(3)).join(' -> ')} (${abl.title})`);
  await page.screenshot({ path: `${out}/interventions.png`, fullPage: true });
  const plain = await page.evaluate(async () => (await fetch('/api/v1/runs/r2/interventions', {
    method: 'POST', headers: { 'Content-Type': 'text/plain' }, body: '{"interventions": []}' })).status);
  check(plain === 415, `a POST without Content-Type application/json is refused (${plain})`);

  // ---- the decoder's task-vector geometry: small multiples ----
  await page.goto(base + '#/run/r7');
  await waitFor(page, () => document.getElementById('circuit-link'), null, 'the decoder run links its geometry');
  await page.click('#circuit-link');
  await waitFor(page, () => window.__circuit && window.__circuit.state === 'none', null, 'no task vectors stored: a button');
  await page.click('#circuit-compute');
  await waitFor(page, () => window.__circuit.state === 'done', null, 'task vectors analysed from the page', 180000);
  const tv = await page.evaluate(() => ({ ...window.__circuit, p0: window.__charts['p0/resid_ratio'] &&
                                          window.__charts['p0/resid_ratio'].series.length - 1 }));
  check(tv.charts >= 3 && tv.p0 === 2, `task-vector small multiples: ${tv.charts} charts, p0 with ${tv.p0} layers`);
  await page.screenshot({ path: `${out}/task-vectors.png`, fullPage: true });

  // ---- the live run: the view advances while it trains ----
  await page.goto(base + '#/run/r8');
  await waitFor(page, () => window.__charts.loss && window.__live.metricEvents > 0, null, 'live metrics arrive');
  const before = await page.evaluate(() => ({ step: window.__live.lastStep, points: window.__charts.loss.data[0].length }));
  await sleep(4000);
  const after = await page.evaluate(() => ({ step: window.__live.lastStep, points: window.__charts.loss.data[0].length,
                                             shown: document.getElementById('run-progress').textContent }));
  check(after.step > before.step, `live progress advances (step ${before.step} -> ${after.step})`);
  check(after.points > before.points, `live curve grows (${before.points} -> ${after.points} points)`);
  check(after.shown.includes(`step ${after.step}`) || /step \d+/.test(after.shown), `progress shown: ${after.shown}`);
  await page.screenshot({ path: `${out}/live.png` });

  // ---- the sweep: a 2x2 heatmap whose cells link to their runs ----
  await page.goto(base + '#/sweep/s1?x=lr&y=seed&value=eval/icl_rare/accuracy');
  await waitFor(page, () => document.querySelectorAll('#heatmap td.cell').length === 4, null, 'heatmap has 4 cells');
  const heat = await page.evaluate(() => ({
    cols: [...document.querySelectorAll('#heatmap thead th')].slice(1).map((t) => t.textContent),
    rows: [...document.querySelectorAll('#heatmap tbody th')].map((t) => t.textContent),
    links: [...document.querySelectorAll('#heatmap td.cell a')].map((a) => a.getAttribute('href')),
    tips: [...document.querySelectorAll('#heatmap td.cell a')].map((a) => a.title),
    values: [...document.querySelectorAll('#heatmap td.cell')].map((td) => td.dataset.value),
    colours: [...document.querySelectorAll('#heatmap td.cell')].map((td) => td.style.background),
    legend: !!document.getElementById('heat-legend'),
    title: document.querySelector('#heatmap h3').textContent,
  }));
  check(JSON.stringify(heat.cols) === '["4","8"]' && JSON.stringify(heat.rows) === '["2","1"]',
        `heatmap labels x ${heat.cols}, y ${heat.rows} growing upward`);
  check(heat.tips.every((t) => /^r[3-6] SUCCEEDED · eval\/icl_rare\/accuracy 0\.\d+/.test(t)),
        `a cell's tooltip: its run, state and value (${heat.tips[0]})`);
  check(heat.links.every((l) => /^#\/run\/r[3-6]$/.test(l)) && new Set(heat.links).size === 4, `cells link to r3..r6: ${heat.links}`);
  check(heat.values.every((v) => v !== '' && !isNaN(Number(v))), `cells hold accuracies: ${heat.values}`);
  check(heat.colours.every((c) => c.startsWith('rgb')) && heat.legend, 'cells coloured, with a colour scale');
  check(heat.title.startsWith('eval/icl_rare/accuracy'), `heatmap title: ${heat.title}`);
  await page.screenshot({ path: `${out}/sweep.png` });
  // Opened without a value, a sweep that stops at an accuracy (the sweep's
  // training.stop_metric) opens on its label map, the labels filling in as
  // their LabelRun jobs end.
  await page.goto(base + '#/sweep/s1');
  await waitFor(page, () => document.getElementById('pivot-value') &&
                            document.getElementById('pivot-value').value === 'pair', null, 'a stop_at sweep opens on pair');
  await waitFor(page, () => [...document.querySelectorAll('#heatmap td.cell')].every((td) => td.dataset.value !== '') &&
                            document.getElementById('heat-legend'), null, 'the label map fills in', 60000);
  const labels = await page.$$eval('#heatmap td.cell', (tds) => tds.map((td) => td.dataset.value));
  check(labels.length === 4 && labels.every((l) => isNaN(Number(l))), `label map cells: ${labels}`);
  await page.screenshot({ path: `${out}/sweep-labels.png` });
  await page.click('#heatmap td.cell a');
  await waitFor(page, () => location.hash.startsWith('#/run/r') && window.__charts.loss, null, 'a cell opens its run');

  // ---- compare: one metric over the sweep's seeds ----
  await page.goto(base + '#/compare?runs=r3,r4,r5,r6&series=eval/icl_rare/accuracy');
  await waitFor(page, () => window.__charts['eval/icl_rare/accuracy'], null, 'compare chart');
  await sleep(300);
  const cmp = await page.evaluate(chartStats, 'eval/icl_rare/accuracy');
  check(cmp && cmp.labels.join() === 'r3,r4,r5,r6' && cmp.series.every((n) => n >= 3), `compare overlays 4 runs ${cmp && cmp.labels}`);
  check(cmp && cmp.painted > 2000, `compare canvas painted (${cmp && cmp.painted} px)`);
  await page.screenshot({ path: `${out}/compare.png` });

  await finish(browser, errors);
});
