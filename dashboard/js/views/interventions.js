// A run's interventions (#/run/ID/interventions): the form, the stored answers, patch heatmaps.
import {ApiError, api, apiPost, errorBox} from '../api.js';
import {Chart, colorBar} from '../charts.js';
import {withTableDownloads} from '../downloads.js';
import {$view, fmt, h, short, sleep} from '../util.js';

// One line per edit of a request: "OP_ZERO_COORDINATE beta", "OP_ABLATE_HEAD L2H1", ...
function describeRequest(rq) {
  const edits = (rq.interventions || []).map((i) => {
    const what = (i.coordinates || []).join(',') || (i.hook ? `${i.hook}${i.positions && i.positions.length ? '@' + i.positions.join(',') : ''}` : '') ||
        (i.layer ? `L${i.layer}H${i.head || 1}` : '');
    return `${short(i.op, 'OP_').toLowerCase()} ${what}`.trim();
  });
  if (rq.patch && (rq.patch.hooks || []).length) edits.push(`patch sweep over ${rq.patch.hooks.join(', ')}`);
  const clean = ((rq.prompts || {}).clean || []).length;
  const on = clean ? `${clean} prompt(s) of your own` : `${rq.n_eval} sequences per set`;
  return `${edits.join('; ') || '(no edit)'} · step ${rq.step} · ${on}`;
}

// A patch effect's colour: white at 0 (the corrupted run's value), blue at
// 1 (the clean run's), red below 0; clamped to [-1, 1]. The colour bar draws it.
const effectColour = (t) => {
  const v = Math.max(-1, Math.min(1, t));
  return v >= 0 ? `rgb(${Math.round(255 - 215 * v)},${Math.round(255 - 170 * v)},${Math.round(255 - 56 * v)})` :
                  `rgb(${Math.round(255 + 46 * v)},${Math.round(255 + 180 * v)},${Math.round(255 + 170 * v)})`;
};
// Two decimals fit a cell; the exact value is in the cell's tooltip.
const cellText = (v) => (Math.abs(v) < 0.005 ? '0.00' : v.toFixed(2));

const PATCH_METRICS = {
  logit_diff: {field: 'effect_logit_diff', raw: 'logit_diff', name: 'logit difference'},
  accuracy: {field: 'effect_accuracy', raw: 'accuracy', name: 'accuracy'},
  loss: {field: 'effect_loss', raw: 'loss', name: 'loss'},
};

// The patch sweep of one evaluation set as a heatmap: hooks (rows) x
// positions (columns), the normalised effect of patching the clean run's
// activation into the corrupted run on the metric it names in its title
// (the logit difference where the set has one, else the accuracy, as the
// CLI headlines; a selector shows the others), with a colour bar.
function patchHeat(effect) {
  const sites = effect.patch || [];
  const hooks = [...new Set(sites.map((p) => p.hook))];
  const positions = [...new Set(sites.map((p) => Number(p.position)))].sort((a, b) => a - b);
  const metrics = Object.keys(PATCH_METRICS).filter((m) => m !== 'logit_diff' || effect.has_logit_diff);
  const box = h('div', {class: 'patch-box', 'data-eval-set': effect.eval_set});
  const pick = h('select', {class: 'patch-metric'}, metrics.map((m) => h('option', {value: m}, PATCH_METRICS[m].name)));
  function render() {
    const m = PATCH_METRICS[pick.value];
    const title = `${effect.eval_set}: effect of patching on the ${m.name} (0 = corrupted, 1 = clean)`;
    const table = h('table', {class: 'heat patch', 'data-metric': pick.value},
      h('thead', {}, h('tr', {}, h('th', {}, 'hook \\ position'), positions.map((q) => h('th', {}, q < 0 ? 'all' : q)))),
      h('tbody', {}, hooks.map((hook) => h('tr', {}, h('th', {}, hook), positions.map((q) => {
        const p = sites.find((x) => x.hook === hook && Number(x.position) === q);
        const v = p ? Number(p[m.field] || 0) : null;
        return h('td', {class: 'cell', style: `background:${v === null ? '#f0f0f0' : effectColour(v)}`,
                        'data-value': v === null ? '' : String(v),
                        title: p ? `${m.name} effect ${fmt(v)} · patched ${m.name} ${fmt(p[m.raw])} · ` +
                                   `loss ${fmt(p.loss)}, accuracy ${fmt(p.accuracy)}` : ''},
                 v === null ? '' : cellText(v));
      })))));
    box.replaceChildren(h('div', {class: 'chart-head'}, h('h4', {class: 'patch-title'}, title),
                          metrics.length > 1 ? h('label', {}, 'metric ', pick) : ''),
                        withTableDownloads(table, title, true),
                        colorBar(-1, 1, (t) => effectColour(2 * t - 1), `${m.name} effect`));
  }
  pick.addEventListener('change', render);
  render();
  return box;
}

function interventionCard(item) {
  const rs = item.response, rq = item.request;
  const effects = rs.effects || [];
  const rows = effects.map((e) => h('tr', {}, h('td', {}, e.eval_set),
    h('td', {class: 'num'}, fmt(e.accuracy_clean)), h('td', {class: 'num'}, fmt(e.accuracy)),
    h('td', {class: 'num'}, fmt(e.loss_clean)), h('td', {class: 'num'}, fmt(e.loss)), h('td', {class: 'num'}, fmt(e.kl_clean)),
    h('td', {class: 'num'}, e.has_logit_diff ? `${fmt(e.logit_diff_clean)} → ${fmt(e.logit_diff)}` : '')));
  const card = h('div', {class: 'chart intervention'},
    h('h3', {}, describeRequest(rq)),
    withTableDownloads(h('table', {class: 'grid effects'},
      h('thead', {}, h('tr', {}, ['set', 'acc clean', 'acc', 'loss clean', 'loss', 'KL', 'logit diff'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows)), `effects ${describeRequest(rq)}`));
  for (const e of effects) {
    if ((e.patch || []).length) card.append(patchHeat(e));
    if ((e.positions || []).length > 1) {
      const box = h('div');
      card.append(box);
      new Chart(box, `${describeRequest(rq)} · ${e.eval_set} per position`, {logY: false, smooth: 0, xLabel: 'position'}).set([
        {label: 'loss clean', xs: e.positions.map((p) => Number(p.position)), ys: e.positions.map((p) => p.loss_clean)},
        {label: 'loss', xs: e.positions.map((p) => Number(p.position)), ys: e.positions.map((p) => p.loss)},
      ]);
    }
  }
  return card;
}

// #/run/{id}/interventions: every stored Intervene answer of the run (its
// request, clean vs intervened metrics per evaluation set, per-position
// effects, patch sweeps as hook x position heatmaps), and a form that runs a
// new ablation for a caller who may start analyses (POST
// /api/v1/runs/{id}/interventions; a reader's is refused).
export function interventionsView(id) {
  const head = h('div'), form = h('div', {id: 'intervene-form'}), status = h('p', {class: 'muted', id: 'intervene-status'});
  const list = h('div', {id: 'interventions'});
  let stopped = false;
  window.__interventions = {state: 'loading', count: 0};

  // A page at a time (the newest ten, then "older" for the next page).
  async function loadList() {
    const base = `/api/v1/runs/${encodeURIComponent(id)}/interventions`;
    const r = await api(base);
    const shown = r.interventions || [];
    list.replaceChildren(...shown.map(interventionCard));
    if (!shown.length) list.replaceChildren(h('p', {class: 'muted'}, 'no intervention stored for this run yet'));
    let token = r.next_page_token;
    const more = h('button', {type: 'button', id: 'interventions-older'}, 'older');
    more.addEventListener('click', async () => {
      const page = await api(`${base}?page_token=${encodeURIComponent(token)}`);
      more.before(...(page.interventions || []).map(interventionCard));
      token = page.next_page_token;
      if (!token) more.remove();
    });
    if (token) list.append(more);
    window.__interventions = {state: 'done', count: shown.length, first: shown[0] || null};
  }

  function buildForm(run) {
    const imir = !(run.spec && run.spec.model && run.spec.model.decoder);
    const op = h('select', {id: 'intervene-op'}, imir ?
      [h('option', {value: 'zero'}, 'zero coordinates'), h('option', {value: 'ablate'}, 'ablate a head')] :
      [h('option', {value: 'json'}, 'a request as JSON')], h('option', {value: 'prompts'}, 'patch your own prompts'));
    // Activation patching on the user's clean/corrupted pair: token ids
    // (and an IMIR model's position ids), the answer and the wrong token
    // whose logit difference is measured at the last position.
    const ids = (v) => v.split(/[\s,]+/).filter(Boolean).map(Number);
    const field = (fid, size, placeholder, value = '') => h('input', {id: fid, size, placeholder, value});
    const pr = {
      hooks: field('prompt-hooks', 30, 'hook points', imir ? 'embed,L1.H1.out,L2.H1.out' : 'L1.post_attn,L1.post_mlp'),
      clean: field('prompt-clean', 24, 'clean token ids'),
      positions: field('prompt-positions', 20, 'position ids (empty: 0, 1, …)'),
      corrupted: field('prompt-corrupted', 24, 'corrupted token ids'),
      answer: field('prompt-answer', 5, 'answer'),
      wrong: field('prompt-wrong', 5, 'wrong'),
    };
    const promptsBox = h('div', {class: 'filters', id: 'prompt-form', hidden: true},
      h('label', {}, 'patch ', pr.hooks), h('label', {}, 'clean ', pr.clean),
      imir ? h('label', {}, 'positions ', pr.positions) : '', h('label', {}, 'corrupted ', pr.corrupted),
      h('label', {}, 'answer ', pr.answer), h('label', {}, 'wrong ', pr.wrong));
    const sequence = (tokens) => {
      const s = {tokens: ids(tokens)};
      if (imir) s.positions = pr.positions.value.trim() ? ids(pr.positions.value) : s.tokens.map((_, i) => i);
      return s;
    };
    const target = h('input', {id: 'intervene-target', value: imir ? 'beta' : '', size: 30,
                               placeholder: imir ? 'alpha, beta, gamma, delta or a label; or the layer (1..L)' : ''});
    const sets = h('input', {id: 'intervene-sets', value: '', size: 24, placeholder: 'all sets'});
    const json = h('textarea', {id: 'intervene-json', rows: 6, cols: 80});
    const requestOf = () => {
      if (op.value === 'json') return JSON.parse(json.value || '{}');
      if (op.value === 'prompts') {
        return {patch: {hooks: pr.hooks.value.split(',').map((x) => x.trim()).filter(Boolean)},
                prompts: {clean: [sequence(pr.clean.value)], corrupted: [sequence(pr.corrupted.value)],
                          answers: ids(pr.answer.value), wrong: ids(pr.wrong.value)}};
      }
      const rq = {eval_sets: sets.value.split(',').map((x) => x.trim()).filter(Boolean)};
      rq.interventions = op.value === 'zero' ?
          [{op: 'OP_ZERO_COORDINATE', coordinates: target.value.split(',').map((x) => x.trim()).filter(Boolean)}] :
          [{op: 'OP_ABLATE_HEAD', layer: Number(target.value) || 1}];
      return rq;
    };
    const sync = () => {
      if (op.value !== 'json') json.value = JSON.stringify(requestOf(), null, 1);
    };
    [op, target, sets, ...Object.values(pr)].forEach((el) => el.addEventListener('input', sync));
    op.addEventListener('change', () => {
      promptsBox.hidden = op.value !== 'prompts';
      for (const el of [target, sets]) if (el.parentElement) el.parentElement.hidden = op.value === 'prompts';
      sync();
    });
    if (!imir) json.value = JSON.stringify({interventions: [{op: 'OP_ZERO', hook: 'L1.post_mlp'}]}, null, 1);
    const run_ = h('button', {id: 'intervene-run', type: 'button'}, 'Run');
    run_.addEventListener('click', async () => {
      let body;
      try {
        body = op.value === 'json' || json.dataset.edited ? JSON.parse(json.value) : requestOf();
      } catch (e) {
        status.replaceChildren(errorBox('the request is not JSON: ' + e.message));
        return;
      }
      run_.disabled = true;
      try {
        for (;;) {
          const r = await apiPost(`/api/v1/runs/${encodeURIComponent(id)}/interventions`, body);
          if (stopped) return;
          if (r.state === 'ANALYSIS_STATE_QUEUED' || r.state === 'ANALYSIS_STATE_RUNNING') {
            status.textContent = `${short(r.state, 'ANALYSIS_STATE_').toLowerCase()} (job ${r.job_id}): ` +
                `${Math.round(100 * (r.progress || 0))}%`;
            await sleep(600);
            continue;
          }
          if (r.state !== 'ANALYSIS_STATE_DONE') throw new Error(r.error || r.state);
          status.textContent = `done${r.from_store ? ' (stored)' : ''}: step ${r.step}`;
          break;
        }
        await loadList();
      } catch (e) {
        status.replaceChildren(errorBox(e));
        window.__interventions.error = e instanceof ApiError ? e.status : String(e);
      } finally {
        run_.disabled = false;
      }
    });
    json.addEventListener('input', () => (json.dataset.edited = '1'));
    form.replaceChildren(h('h3', {}, 'Run an intervention'),
      h('div', {class: 'filters'}, h('label', {}, 'edit ', op), imir ? h('label', {}, 'on ', target) : '',
        h('label', {}, 'evaluation sets ', sets), run_),
      promptsBox,
      h('details', {}, h('summary', {}, 'the request as JSON (InterveneRequest; edit for hook-point ops, patches, ' +
                                        'attention masses: examples/intervene_*.json)'), json));
    sync();
  }

  (async () => {
    try {
      const run = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
      head.replaceChildren(h('h2', {}, `${run.run_id} · ${run.name || ''} · interventions`),
                           h('p', {}, h('a', {href: `#/run/${id}`}, 'back to the run')));
      const who = await api('/api/v1/whoami').catch(() => null);
      if (who && who.role && /reader/i.test(who.role)) {
        form.replaceChildren(h('p', {class: 'muted'}, 'your role reads stored interventions only'));
      } else {
        buildForm(run);
      }
      await loadList();
    } catch (e) {
      status.replaceChildren(errorBox(e));
      window.__interventions = {state: 'error'};
    }
  })();
  $view.replaceChildren(head, form, status, list);
  return () => {
    stopped = true;
  };
}
