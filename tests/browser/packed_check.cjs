// A packed sweep's runs in headless chromium (issue 48): each member is its
// own run page whose detail names, and links, the member it trained with.
//   node packed_check.cjs BASE_URL OUT_DIR RUN_A RUN_B
// The server ran with --max-ensemble 2, and RUN_A and RUN_B are the two
// seeds of tests/browser/packed.json (IMIR at batch 32: they pack on a CPU
// slot). Screenshot: OUT_DIR/run-packed.png.
'use strict';

const [base, out, a, b] = process.argv.slice(2);
const { check, waitFor, openPage, finish, main } = require('./browser_util.cjs');

main(async () => {
  const { browser, page, errors } = await openPage();
  for (const [id, other] of [[a, b], [b, a]]) {
    await page.goto(base + `#/run/${id}`);
    await waitFor(page, () => document.getElementById('run-packed-with') !== null, null, `${id}: a "packed with" line`);
    const line = await page.evaluate(() => {
      const el = document.getElementById('run-packed-with');
      return { text: el.textContent, links: [...el.querySelectorAll('a')].map((l) => l.getAttribute('href')) };
    });
    check(line.text.startsWith(`${other} `) && JSON.stringify(line.links) === JSON.stringify([`#/run/${other}`]),
          `${id} names and links ${other}: ${JSON.stringify(line)}`);
    if (id === a) await page.screenshot({ path: `${out}/run-packed.png` });
  }
  // A lone run has no such line.
  await page.goto(base + '#/run/r1');
  await waitFor(page, () => document.getElementById('run-state') !== null, null, 'r1 opens');
  check(await page.evaluate(() => document.getElementById('run-packed-with') === null), 'r1 (trained alone) has no "packed with" line');
  await finish(browser, errors);
});
