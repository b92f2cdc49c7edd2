// The dashboard's reproduction pages in headless chromium (issue 34):
//   node reproduction_check.cjs BASE_URL OUT_DIR
// The server has p1 (E.4 at ci: two runs, coordinate trajectories), p2
// (E.9 at ci: a 4 x 4 plane and the outside-coordinate cells) and p3
// (axis_recipe.json: one axis besides the seed, two seeds, one check
// failing), all DONE.
// Screenshots: OUT_DIR/reproductions.png, reproduction-e4.png, reproduction-e9.png, reproduction-axis.png.
'use strict';

const [base, out] = process.argv.slice(2);
const { check, waitFor, openPage, chartStats, finish, main, downloadsOf, parseCsv, csvMatchesChart } = require('./browser_util.cjs');

main(async () => {
  const { browser, page, errors } = await openPage();

  // ---- the list: both reproductions DONE, the recipes with a command each ----
  await page.goto(base + '#/reproductions');
  await waitFor(page, () => document.querySelectorAll('#reproductions tr[data-reproduction]').length === 3, null,
                'the reproductions table lists p1, p2 and p3');
  const listed = await page.evaluate(() => [...document.querySelectorAll('#reproductions tr[data-reproduction]')]
    .map((tr) => tr.textContent));
  check(listed.every((t) => t.includes('DONE')), `both DONE: ${listed.join(' | ')}`);
  const recipes = await page.evaluate(() => [...document.querySelectorAll('#recipes tbody tr')].map((tr) => tr.textContent));
  check(recipes.length >= 5 && recipes.some((t) => t.includes('circuitlab reproduce run E.9')),
        `recipes listed with their command (${recipes.length})`);
  await page.screenshot({ path: `${out}/reproductions.png`, fullPage: true });

  // ---- E.4: every check PASS, the coordinate trajectories drawn ----
  await page.goto(base + '#/reproduction/p1');
  await waitFor(page, () => document.querySelectorAll('#checks tr[data-outcome]').length === 5, null, 'E.4: five checks');
  const outcomes = await page.evaluate(() => [...document.querySelectorAll('#checks tr[data-outcome]')]
    .map((tr) => tr.getAttribute('data-outcome')));
  check(outcomes.every((o) => o === 'PASS'), `E.4 outcomes ${outcomes.join(',')}`);
  await waitFor(page, () => Object.keys(window.__charts).some((t) => t.includes('trajectory:')), null,
                'E.4: a trajectory chart');
  for (const name of ['unit · trajectory:gamma', 'unit · trajectory:beta', 'prototype · trajectory:alpha']) {
    const c = await page.evaluate(chartStats, name);
    check(c && c.points > 50 && c.painted > 500, `E.4 chart ${name}: ${JSON.stringify(c)}`);
  }
  const strip = await page.evaluate(() => [...document.querySelectorAll('#margins circle')].map((c) => c.getAttribute('data-passed')));
  check(strip.length === 5 && strip.every((p) => p === 'true'), `E.4 margin strip: 5 green dots (${strip})`);
  // The paper's figure the recipe names (issue 50): gamma, beta, alpha over training, first on the page.
  const paper = await page.evaluate(() => {
    const f = document.querySelector('#figures .paper-figure[data-figure="0"]');
    return f && { title: f.querySelector('h4').textContent, charts: f.querySelectorAll('.chart').length,
                  first: document.querySelector('#figures .figure') === f };
  });
  check(paper && paper.charts === 3 && paper.first && /three coordinates/.test(paper.title),
        `E.4's paper figure: three series first on the page (${JSON.stringify(paper)})`);
  for (const name of ['gamma', 'beta', 'alpha']) {
    const c = await page.evaluate(chartStats, `${paper.title} · trajectory:${name}`);
    check(c && c.points > 50 && c.painted > 500, `E.4 paper figure ${name}: ${JSON.stringify(c)}`);
  }
  // Downloads (issue 46): the Markdown report the server renders (the CLI's
  // file), the checks as CSV, every chart's CSV as drawn, the margins as SVG.
  const [md] = await downloadsOf(page, '#report-download', 'markdown');
  const cliMd = await page.evaluate(async () => (await fetch('/api/v1/reproductions/p1/report.md')).text());
  check(md && md.text === cliMd && /^# /.test(md.text) && md.text.includes('E.4') && md.name === 'p1-E.4.md',
        `the Markdown report downloads (${md && md.name}, ${md && md.bytes} bytes)`);
  const [checksCsv] = await downloadsOf(page, '#view .downloadable:has(#checks)', 'csv');
  const checkRows = checksCsv ? parseCsv(checksCsv.text) : [];
  check(checkRows.length === 6 && checkRows.slice(1).every((r) => r[3] === 'PASS'), `the checks' CSV: 5 checks, PASS (${checkRows.length} rows)`);
  const figureCharts = await page.evaluate(() => Object.keys(window.__charts).filter((t) => t.includes('trajectory:')));
  const chartFiles = await downloadsOf(page, '#figures .chart', 'csv');
  const chartTitles = await page.$$eval('#figures .chart', (els) => els.map((e) => e.querySelector('.u-title') && e.querySelector('.u-title').textContent));
  let matched = 0;
  for (let i = 0; i < chartTitles.length; i++) {
    const why = await csvMatchesChart(page, chartTitles[i], chartFiles[i]);
    check(why === '', `E.4 figure '${chartTitles[i]}': CSV ${why || 'matches the chart'}`);
    if (!why) matched++;
  }
  check(matched >= 3 && figureCharts.length >= 3, `every E.4 chart downloads as CSV (${matched} of ${chartTitles.length})`);
  const [marginsSvg] = await downloadsOf(page, '.figure[data-table="margins"]', 'svg');
  check(marginsSvg && (marginsSvg.text.match(/<circle/g) || []).length === 5, 'the margin strip downloads as SVG with its 5 dots');
  await page.screenshot({ path: `${out}/reproduction-e4.png`, fullPage: true });

  // ---- E.9: the label maps of the plane, coloured, y upward ----
  await page.goto(base + '#/reproduction/p2');
  await waitFor(page, () => document.querySelectorAll('.figure[data-table="plane"] .label-map').length >= 1, null,
                'E.9: the plane has a label map');
  const map = await page.evaluate(() => {
    const m = document.querySelector('.figure[data-table="plane"] .label-map');
    const cells = [...m.querySelectorAll('td.cell')];
    const ys = [...m.querySelectorAll('tbody th')].map((th) => Number(th.textContent));
    return { cells: cells.length, labelled: cells.filter((c) => c.getAttribute('data-value')).length,
             colours: new Set(cells.map((c) => c.style.background)).size, ys };
  });
  check(map.cells === 16 && map.labelled === 16, `E.9 plane map: 16 cells, all labelled (${JSON.stringify(map)})`);
  check(map.colours >= 2, `E.9 map has >= 2 colours (${map.colours})`);
  check(map.ys[0] > map.ys[map.ys.length - 1], `E.9 map's y axis grows upward (${map.ys})`);
  const e9 = await page.evaluate(() => [...document.querySelectorAll('#checks tr[data-outcome]')].map((tr) => tr.getAttribute('data-outcome')));
  check(e9.length === 6 && e9.filter((o) => o === 'PASS').length === 5 && e9[3] === 'REPORTED',
        `E.9 outcomes: five gates pass, the crossings count is reported only (${e9.join(',')})`);
  const e9paper = await page.evaluate(() => {
    const f = document.querySelector('#figures .paper-figure[data-figure="0"]');
    return f && { maps: f.querySelectorAll('.label-map').length, cells: f.querySelectorAll('td.cell[data-value]').length };
  });
  check(e9paper && e9paper.maps === 1 && e9paper.cells === 16, `E.9's paper figure: the plane's label map (${JSON.stringify(e9paper)})`);
  const [mapCsv] = await downloadsOf(page, '#figures .paper-figure[data-figure="0"] .label-map', 'csv');
  const mapRows = mapCsv ? parseCsv(mapCsv.text) : [];
  check(mapRows.length === 5 && mapRows.slice(1).every((r) => r.length === 5 && r.slice(1).every((v) => v !== '')),
        `E.9's label map as CSV: 4 x 4 labels (${mapRows.length} rows)`);
  await page.screenshot({ path: `${out}/reproduction-e9.png`, fullPage: true });

  // ---- one axis besides the seed: a line per seed; the failing check red ----
  await page.goto(base + '#/reproduction/p3');
  await waitFor(page, () => Object.keys(window.__charts).some((t) => t === 'lr · train/loss by lr'), null,
                'axis recipe: the loss drawn against lr');
  const axis = await page.evaluate(() => {
    const u = window.__charts['lr · train/loss by lr'];
    return { xs: u.data[0], lines: u.data.length - 1, finite: u.data.slice(1).every((ys) => ys.every((y) => Number.isFinite(y))) };
  });
  check(JSON.stringify(axis.xs) === '[1,4]' && axis.lines === 2 && axis.finite, `axis chart: x = lr, a line per seed (${JSON.stringify(axis)})`);
  const dots = await page.evaluate(() => [...document.querySelectorAll('#margins circle')].map((c) => c.getAttribute('data-passed')));
  check(dots.length === 4 && dots.filter((p) => p === 'false').length === 2, `axis recipe strip: 4 dots, 2 red (${dots})`);
  await page.screenshot({ path: `${out}/reproduction-axis.png`, fullPage: true });

  await finish(browser, errors);
});
