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

module.exports = { failures, check, waitFor, openPage, chartStats, finish, main };
