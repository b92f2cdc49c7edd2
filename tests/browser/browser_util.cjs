// What the browser checks share: headless chromium with a page whose errors
// are collected, a check that records failures, a wait for a condition in
// the page that counts as a failed check when it times out, a chart's
// drawn data, and the ending that closes the browser and sets the exit code.
'use strict';
const puppeteer = require('puppeteer-core');

const failures = [];
const check = (ok, what) => { if (!ok) failures.push(what); console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`); };

async function waitFor(page, fn, arg, what, timeout = 20000) {
  try {
    await page.waitForFunction(fn, { timeout, polling: 100 }, arg);
    return true;
  } catch (e) {
    check(false, `${what} (timed out)`);
    return false;
  }
}

// A 1280 x 900 page; `errors` collects console errors, page errors, HTTP
// responses >= 400 and failed requests, except those `expected(kind, text,
// request)` accepts (kind: 'console', 'response' or 'requestfailed').
async function openPage(expected = () => false) {
  const browser = await puppeteer.launch({ executablePath: '/usr/bin/chromium', headless: true,
                                           args: ['--no-sandbox', '--disable-gpu'] });
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  const errors = [];
  page.on('console', (m) => { if (m.type() === 'error' && !expected('console', m.text())) errors.push(m.text()); });
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('response', (r) => {
    if (r.status() >= 400 && !expected('response', String(r.status()), r.request())) errors.push(`HTTP ${r.status()} ${r.url()}`);
  });
  page.on('requestfailed', (r) => { if (!expected('requestfailed', r.url(), r)) errors.push('request failed: ' + r.url()); });
  return { browser, page, errors };
}

// Points a chart (window.__charts[title], uPlot) holds and pixels its canvas
// painted; run in the page: page.evaluate(chartStats, title).
function chartStats(title) {
  const u = window.__charts[title];
  if (!u) return null;
  const series = u.data.slice(1).map((ys) => ys.filter((v) => v !== null && v !== undefined).length);
  const c = u.ctx.canvas;
  const d = u.ctx.getImageData(0, 0, c.width, c.height).data;
  let painted = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i]) painted++;
  return { series, labels: u.series.slice(1).map((s) => s.label), points: u.data[0].length, painted };
}

// Clicks the `kind` download button ('csv', 'png', 'svg', 'markdown') inside
// every element matching `selector`, in order, and returns what each saved
// (window.__downloads: {name, type, bytes, text}; null where the element has
// no such button or nothing was saved within 2.5 s).
async function downloadsOf(page, selector, kind) {
  return page.evaluate(async (sel, k) => {
    const out = [];
    for (const el of document.querySelectorAll(sel)) {
      const b = el.querySelector(`button.download[data-download="${k}"]`);
      if (!b) {
        out.push(null);
        continue;
      }
      const n = window.__downloads.length;
      b.click();
      for (let i = 0; i < 50 && window.__downloads.length === n; i++) await new Promise((r) => setTimeout(r, 50));
      out.push(window.__downloads[n] || null);
    }
    return out;
  }, selector, kind);
}

// RFC 4180 CSV text -> rows of strings.
function parseCsv(text) {
  const rows = [];
  let row = [], field = '', quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ',') { row.push(field); field = ''; }
    else if (c === '\n') { row.push(field); rows.push(row); row = []; field = ''; }
    else if (c !== '\r') field += c;
  }
  if (field || row.length) { row.push(field); rows.push(row); }
  return rows;
}

// A chart's CSV (a download record) against what the chart drew
// (window.__charts[title]: x then one column per series): the header names
// x and every series, one row per x, every value the drawn one. '' when
// they agree, else what differs.
async function csvMatchesChart(page, title, file) {
  if (!file || !file.text) return 'no CSV saved';
  const u = await page.evaluate((t) => {
    const p = window.__charts[t];
    return p && { labels: p.series.map((s) => s.label), data: p.data };
  }, title);
  if (!u) return 'no chart';
  const rows = parseCsv(file.text);
  if (rows[0].slice(1).join('|') !== u.labels.slice(1).join('|')) return `header ${rows[0]} vs ${u.labels}`;
  if (rows.length - 1 !== u.data[0].length) return `${rows.length - 1} rows for ${u.data[0].length} points`;
  for (let i = 0; i < u.data[0].length; i++)
    for (let j = 0; j < u.data.length; j++) {
      const v = u.data[j][i], cell = rows[i + 1][j];
      if ((v === null || v === undefined) ? cell !== '' : Number(cell) !== v) return `row ${i + 1} column ${j}: ${cell} vs ${v}`;
    }
  return '';
}

// The last check (no errors), then exit 1 when any check failed.
async function finish(browser, errors) {
  check(errors.length === 0, `no console errors or failed requests ${JSON.stringify(errors.slice(0, 3))}`);
  await browser.close();
  if (failures.length) {
    console.log(`${failures.length} check(s) failed`);
    process.exit(1);
  }
}

// Runs an async check body; an exception fails the check run.
function main(body) {
  body().catch((e) => { console.error(e); process.exit(1); });
}

module.exports = { failures, check, waitFor, openPage, chartStats, finish, main, downloadsOf, parseCsv, csvMatchesChart };
