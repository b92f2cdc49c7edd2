// Drives the dashboard in headless chromium as a person would and asserts on
// what is drawn (chart data and painted canvas pixels, not only elements).
//   node dashboard_check.cjs BASE_URL OUT_DIR
// The server has r1, r2 (finished runs; r2 is the README's demo,
// examples/induction.json), s1 = r3..r6 (a finished 2x2 sweep of lr x seed),
// r7 (a finished decoder, examples/dice_task_vectors.json) and r8 training
// live. Screenshots: OUT_DIR/{runs,run,attention,circuit,task-vectors,live,
// sweep,sweep-labels,compare}.png. Downloads (issue 46) are checked from what
// the page saved (window.__downloads) and, once, from the file chromium wrote.
'use strict';

const [base, out] = process.argv.slice(2);
const { check, waitFor, openPage, chartStats, finish, main, downloadsOf, parseCsv, csvMatchesChart } = require('./browser_util.cjs');
const fs = require('fs');
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
  // rho (in [0, 1]) on its own right-hand axis, not the coordinates' scale.
  const rhoAxis = await page.evaluate(() => {
    const u = window.__charts.coordinates;
    const i = u.series.findIndex((x) => x.label && x.label.startsWith('rho'));
    const ax = u.axes.find((a) => a.scale === 'r');
    return { scale: i > 0 ? u.series[i].scale : null, others: u.series.slice(1).filter((x, k) => k + 1 !== i).map((x) => x.scale),
             side: ax && ax.side, label: ax && ax.label, rmin: u.scales.r.min, rmax: u.scales.r.max };
  });
  check(rhoAxis.scale === 'r' && rhoAxis.others.every((x) => x === 'y') && rhoAxis.side === 1 && rhoAxis.label === 'ρ' &&
        rhoAxis.rmin <= 0 && rhoAxis.rmax >= 1,
        `rho on its own right-hand axis labelled ρ (${JSON.stringify(rhoAxis)})`);
  // Every chart's CSV holds exactly what it drew; a PNG of one; and the file
  // chromium itself writes for a click equals what the page saved.
  const runCharts = await page.$$eval('#charts .chart', (els) => els.map((e) => e.dataset.chart));
  const runCsvs = await downloadsOf(page, '#charts .chart', 'csv');
  for (let i = 0; i < runCharts.length; i++) {
    const why = await csvMatchesChart(page, runCharts[i], runCsvs[i]);
    check(why === '', `run page chart '${runCharts[i]}': CSV download ${runCsvs[i] && runCsvs[i].name} ${why || 'matches the chart'}`);
  }
  const [png] = await downloadsOf(page, '#charts .chart[data-chart="coordinates"]', 'png');
  check(png && png.type === 'image/png' && png.bytes > 2000 && png.name === 'coordinates.png', `coordinates PNG download (${png && png.bytes} bytes)`);
  const downloadDir = `${out}/downloads`;
  fs.rmSync(downloadDir, { recursive: true, force: true });
  fs.mkdirSync(downloadDir, { recursive: true });
  const cdp = await page.createCDPSession();
  await cdp.send('Browser.setDownloadBehavior', { behavior: 'allow', downloadPath: downloadDir });
  const [lossFile] = await downloadsOf(page, '#charts .chart[data-chart="loss"]', 'csv');
  for (let i = 0; i < 50 && !fs.existsSync(`${downloadDir}/loss.csv`); i++) await sleep(100);
  const written = fs.existsSync(`${downloadDir}/loss.csv`) ? fs.readFileSync(`${downloadDir}/loss.csv`, 'utf8') : null;
  check(written !== null && lossFile && written === lossFile.text && parseCsv(written).length > 3,
        `chromium wrote loss.csv as saved (${written ? parseCsv(written).length : 0} rows)`);
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
    // The previous-token stripe of the layer-1 head (L1H1: layers count from 1):
    // at each block's second position (even t >= 2, the value after its
    // key) the head looks at t - 1. Read from the page's own data.
    const p = a.answer.patterns.find((x) => Number(x.layer) === 1 && Number(x.sequence || 0) === a.sequence);
    let sum = 0, n = 0;
    for (let q = 2; q < p.size; q += 2) { sum += p.weights[q * p.size + q - 1]; n++; }
    return { heads: [...document.querySelectorAll('#attention-grid figure')].map((f) => f.dataset.head), painted,
             answer_w21: p.weights[2 * p.size + 1],
             step: a.step, steps: Number(document.getElementById('attention-step').max) + 1, stripe: sum / n,
             tokens: a.answer.sequences[a.sequence].tokens.length, size: p.size };
  });
  check(JSON.stringify(att.heads) === '["L1H1","L2H1"]', `one heatmap per head: ${att.heads}`);
  // The heads as the page renders them (the layer heading each sits under,
  // its caption's head, its name), for browser_test.sh to compare with the
  // CLI's, the HTTP API's and Python's names of the same run's heads.
  const rendered = await page.evaluate(() => [...document.querySelectorAll('#attention-grid .layer')].flatMap((div) =>
    [...div.querySelectorAll('figure')].map((f) => {
      const layer = Number(div.querySelector('h3').textContent.replace('layer ', ''));
      const head = Number(f.querySelector('figcaption').textContent.match(/\(head (\d+)\)/)[1]);
      return `${layer},${head},${f.dataset.head}`;
    })));
  fs.writeFileSync(`${out}/heads-dashboard.txt`, rendered.sort().join('\n') + '\n');
  check(att.painted.length === 2 && att.painted.every((n) => n > 500), `heatmaps painted (${att.painted} px)`);
  check(att.step === 600 && att.steps === 3, `newest checkpoint shown, slider over 3 (step ${att.step}, ${att.steps} steps)`);
  check(att.tokens === att.size, `the sequence's ${att.tokens} tokens label the ${att.size} x ${att.size} map`);
  check(att.stripe > 0.5, `L1H1 previous-token stripe: mean weight on t-1 at the blocks' second positions ${att.stripe.toFixed(3)}`);
  const box = await (await page.$('#attention-grid canvas')).boundingBox();
  await page.mouse.move(box.x + box.width - 4, box.y + box.height - 4);  // the last query's last key
  const tip = await page.evaluate(() => !document.getElementById('attention-tip').hidden &&
                                        document.getElementById('attention-tip').textContent);
  check(tip && /query \d+ \(token \d+\) → key \d+/.test(tip), `hover reads a weight: ${tip}`);
  const legible = await page.evaluate(() => ({
    bar: document.querySelector('#attention-bar .colorbar') && document.querySelector('#attention-bar .colorbar').dataset.label,
    pads: [...document.querySelectorAll('#attention-grid canvas')].map((c) => Number(c.dataset.pad)),
    widths: [...document.querySelectorAll('#attention-grid canvas')].map((c) => c.width),
  }));
  check(legible.bar === 'attention weight' && legible.pads.every((p) => p > 0) && legible.widths.every((w) => w >= 300),
        `attention heatmaps: a colour bar (${legible.bar}), token labels (pad ${legible.pads}), >= 300 px (${legible.widths})`);
  const [attCsv] = await downloadsOf(page, '#attention-bar', 'csv');
  const attRows = attCsv ? parseCsv(attCsv.text) : [];
  const T = att.size, causal = T * (T + 1) / 2;
  const stripeRows = attRows.filter((r) => r[0] === 'L1H1' && Number(r[4]) === 2 && Number(r[6]) === 1);
  check(attRows.length === 1 + 2 * causal && stripeRows.length === 1 &&
        Math.abs(Number(stripeRows[0][8]) - att.answer_w21) < 1e-6,
        `attention CSV: a row per causal weight of both heads (${attRows.length - 1} = 2 x ${causal}), values as drawn`);
  await page.click('#attention-grid canvas');
  await waitFor(page, () => document.querySelector('#attention-zoom canvas'), null, 'a click enlarges the head');
  check(await page.evaluate(() => !!document.querySelector('#attention-zoom .colorbar')), 'the enlarged head has its colour bar');
  await page.screenshot({ path: `${out}/attention.png`, fullPage: true });
  await page.evaluate(() => {
    const s = document.getElementById('attention-step');
    s.value = 0;
    s.dispatchEvent(new Event('change'));
  });
  await waitFor(page, () => window.__attention.state === 'done' && window.__attention.step === 200, null,
                'the slider shows the first checkpoint (step 200)', 60000);
  // Tokens typed in (GetActivations over POST /activations): the demo's
  // prompt (docs/tutorials/own-prompts.md) at the newest checkpoint; L2H1,
  // the induction head, reads the token after the query's earlier twin.
  await page.evaluate(() => {
    const s = document.getElementById('attention-step');
    s.value = s.max;
    s.dispatchEvent(new Event('change'));
  });
  await waitFor(page, () => window.__attention.state === 'done' && window.__attention.step === 600, null, 'back at step 600', 60000);
  await page.$eval('#attention-tokens', (el) => { el.value = '0 14 30 22 25 14'; });
  await page.$eval('#attention-positions', (el) => { el.value = '0,3,4,9,10,12'; });
  await page.click('#attention-own-run');
  await waitFor(page, () => window.__attention.state === 'done' && window.__attention.typed, null, 'typed tokens drawn', 60000);
  const typed = await page.evaluate(() => {
    const a = window.__attention;
    const l2 = a.answer.patterns.find((p) => p.name === 'L2H1');
    return { heads: [...document.querySelectorAll('#attention-grid figure')].map((f) => f.dataset.head),
             size: l2 && l2.size, w: l2 && l2.weights[5 * 6 + 2], tokens: a.answer.sequences[0].tokens.join(' ') };
  });
  check(JSON.stringify(typed.heads) === '["L1H1","L2H1"]' && typed.size === 6 && typed.w > 0.5,
        `typed tokens ${typed.tokens}: L2H1 from the query to the 30 after the first 14 weighs ${typed.w && typed.w.toFixed(3)}`);
  await page.screenshot({ path: `${out}/attention-typed.png`, fullPage: true });

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
  const [effectsCsv] = await downloadsOf(page, '.intervention', 'csv');
  const effectRows = effectsCsv ? parseCsv(effectsCsv.text) : [];
  check(effectRows.length === 3 && effectRows[0][0] === 'set' && effectRows.slice(1).map((r) => r[0]).sort().join() === 'icl_rare,iwl',
        `the effects table's CSV: a header and both sets (${effectRows.map((r) => r[0])})`);
  // A patch of the user's own clean/corrupted pair through the form: the
  // heatmap names its metric, has a colour bar, and its numbers fit.
  await page.select('#intervene-op', 'prompts');
  const fill = async (sel, v) => page.$eval(sel, (el, x) => { el.value = x; el.dispatchEvent(new Event('input')); }, v);
  await fill('#prompt-hooks', 'embed,L1.H1.out,L2.H1.out');
  await fill('#prompt-clean', '0 14 30 22 25 14');
  await fill('#prompt-positions', '0 3 4 9 10 12');
  await fill('#prompt-corrupted', '0 14 30 22 25 22');
  await fill('#prompt-answer', '30');
  await fill('#prompt-wrong', '25');
  await page.click('#intervene-run');
  await waitFor(page, () => window.__interventions.count === 2, null, 'the prompts patch ran and is listed', 120000);
  const patch = await page.evaluate(() => {
    const box = document.querySelector('.patch-box[data-eval-set="prompts"]');
    const t = box.querySelector('table.heat.patch');
    const cells = [...t.querySelectorAll('td.cell')];
    const row = [...t.querySelectorAll('tbody tr')].find((tr) => tr.querySelector('th').textContent === 'L2.H1.out');
    const cols = [...t.querySelectorAll('thead th')].map((th) => th.textContent);
    const at5 = row && row.children[cols.indexOf('5')];
    return { metric: t.dataset.metric, title: box.querySelector('.patch-title').textContent,
             bar: !!box.querySelector('.colorbar'), longest: Math.max(...cells.map((c) => c.textContent.length)),
             overflow: cells.filter((c) => c.scrollWidth > c.clientWidth + 1).length, l2: at5 && Number(at5.dataset.value) };
  });
  check(patch.metric === 'logit_diff' && /logit difference/.test(patch.title) && patch.bar,
        `the patch heatmap names its metric (${patch.title}) and has a colour bar`);
  check(patch.longest <= 5 && patch.overflow === 0,
        `patch numbers fit their cells (longest ${patch.longest} characters, ${patch.overflow} overflow)`);
  check(patch.l2 > 0.9, `patching L2.H1.out at the query restores the logit difference (${patch.l2})`);
  const [heatCsv] = await downloadsOf(page, '.patch-box[data-eval-set="prompts"]', 'csv');
  const [heatSvg] = await downloadsOf(page, '.patch-box[data-eval-set="prompts"]', 'svg');
  const heatRows = heatCsv ? parseCsv(heatCsv.text) : [];
  check(heatRows.length === 4 && heatRows.slice(1).map((r) => r[0]).join() === 'embed,L1.H1.out,L2.H1.out',
        `the patch heatmap's CSV: a row per hook (${heatRows.map((r) => r[0])})`);
  check(heatSvg && heatSvg.type === 'image/svg+xml' && /<svg[^>]*>/.test(heatSvg.text) && (heatSvg.text.match(/<rect/g) || []).length >= 10,
        `the patch heatmap's SVG (${heatSvg && heatSvg.bytes} bytes)`);
  await page.screenshot({ path: `${out}/interventions.png`, fullPage: true });
  await page.select('.patch-box[data-eval-set="prompts"] select.patch-metric', 'loss');
  check(await page.evaluate(() => /on the loss/.test(document.querySelector('.patch-box[data-eval-set="prompts"] .patch-title').textContent)),
        'the metric selector retitles the heatmap');
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
  const p0Lines = await page.evaluate(() => window.__charts['p0/resid_ratio'].series.slice(1).map((x) => x.label).join());
  check(p0Lines === 'layer 1,layer 2', `the decoder's layers count from 1: ${p0Lines}`);
  const tvTitles = await page.$$eval('#view .charts .chart', (els) => els.map((e) => e.dataset.chart));
  const tvCsvs = await downloadsOf(page, '#view .charts .chart', 'csv');
  let tvMatched = 0;
  for (let i = 0; i < tvTitles.length; i++) if (await csvMatchesChart(page, tvTitles[i], tvCsvs[i]) === '') tvMatched++;
  check(tvMatched === tvTitles.length, `every task-vector chart's CSV matches it (${tvMatched} of ${tvTitles.length})`);
  const [scalarsCsv] = await downloadsOf(page, '#view .downloadable', 'csv');
  check(scalarsCsv && parseCsv(scalarsCsv.text).length === 1 + tv.scalars, `the per-layer table's CSV (${tv.scalars} values)`);
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
  const [sweepCsv] = await downloadsOf(page, '#heatmap', 'csv');
  const [sweepSvg] = await downloadsOf(page, '#heatmap', 'svg');
  const sweepRows = sweepCsv ? parseCsv(sweepCsv.text) : [];
  check(sweepRows.length === 3 && sweepRows.slice(1).every((r) => r.slice(1).every((v) => v !== '' && !isNaN(Number(v)))) &&
        sweepRows.slice(1).flatMap((r) => r.slice(1)).sort().join() === [...heat.values].sort().join(),
        `the heatmap's CSV holds its cells' values (${JSON.stringify(sweepRows)})`);
  check(sweepSvg && (sweepSvg.text.match(/<rect/g) || []).length === 5, `the heatmap's SVG: a background and 4 cells`);
  const [membersCsv] = await downloadsOf(page, '#heatmap ~ div', 'csv');
  check(membersCsv && parseCsv(membersCsv.text).length === 5, `the members table's CSV: a header and 4 runs`);
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

  // ---- compare: two metrics over the sweep's members, their differing spec fields ----
  await page.goto(base + '#/compare?runs=r3,r4,r5,r6&series=eval/icl_rare/accuracy,train/loss');
  await waitFor(page, () => window.__compare && window.__compare.state === 'done' && window.__charts['train/loss'], null, 'compare page');
  await sleep(300);
  const cmp = await page.evaluate(chartStats, 'eval/icl_rare/accuracy');
  check(cmp && cmp.labels.length === 4 && cmp.labels.every((l, i) => l.startsWith(`r${i + 3} · `) && /learning_rate=/.test(l)) &&
        cmp.series.every((n) => n >= 3), `compare names 4 runs by id, name and what differs: ${cmp && cmp.labels.join(' | ')}`);
  check(cmp && cmp.painted > 2000, `compare canvas painted (${cmp && cmp.painted} px)`);
  const diff = await page.evaluate(() => ({
    fields: [...document.querySelectorAll('#cmp-table tr[data-field]')].map((tr) => tr.dataset.field),
    lr: [...document.querySelectorAll('#cmp-table tr[data-field="training.learning_rate"] td')].map((td) => td.textContent),
    finals: document.querySelectorAll('#cmp-table tr[data-series]').length,
    charts: document.querySelectorAll('#view .charts .chart').length,
  }));
  check(diff.fields.includes('training.learning_rate') && diff.fields.includes('seed') &&
        diff.fields.every((f) => !f.startsWith('model.') && !f.startsWith('task.')),
        `the config diff lists only the fields that differ: ${diff.fields.join(', ')}`);
  check(JSON.stringify(diff.lr) === '["4","4","8","8"]' || new Set(diff.lr).size === 2, `learning rates side by side: ${diff.lr}`);
  check(diff.finals === 2 && diff.charts === 2, `two series: two charts and their last values (${diff.charts}, ${diff.finals})`);
  const cmpCsvs = await downloadsOf(page, '#view .charts .chart', 'csv');
  for (const [i, t] of ['eval/icl_rare/accuracy', 'train/loss'].entries()) {
    const why = await csvMatchesChart(page, t, cmpCsvs[i]);
    check(why === '', `compare chart '${t}': CSV ${why || 'matches the chart'}`);
  }
  const [diffCsv] = await downloadsOf(page, '#cmp-diff', 'csv');
  const diffRows = diffCsv ? parseCsv(diffCsv.text) : [];
  check(diffRows.length === 1 + diff.fields.length + 2 && diffRows[0].length === 5, `the diff table's CSV (${diffRows.length} rows)`);
  await page.screenshot({ path: `${out}/compare.png` });

  // ---- the runs table's CSV ----
  await page.goto(base + '#/');
  await waitFor(page, () => document.querySelectorAll('#runs tr[data-run]').length === 8, null, 'runs table again');
  const [runsCsv] = await downloadsOf(page, '#view .downloadable', 'csv');
  const runRows = runsCsv ? parseCsv(runsCsv.text) : [];
  check(runRows.length === 9 && runRows[0][0] === 'run' && runRows.slice(1).map((r) => r[0]).sort().join() ===
        'r1,r2,r3,r4,r5,r6,r7,r8', `the runs table's CSV: a header and 8 runs (${runRows.length} rows)`);

  await finish(browser, errors);
});
