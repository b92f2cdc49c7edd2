// What the browser checks share: a check that records failures, and a wait
// for a condition in the page that counts as a failed check when it times out.
'use strict';

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

module.exports = { failures, check, waitFor };
