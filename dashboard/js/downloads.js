// Downloads: every chart and table of the dashboard offers its data as CSV,
// charts their picture as PNG (canvas) or SVG (vector), the reproduction
// page its Markdown report. Files are made in the page (Blob + <a download>),
// so they carry the tab's token-read data without a second request; each
// is recorded in window.__downloads (name, type, bytes, text for text files)
// for the browser tier.
import {h} from './util.js';

window.__downloads = [];

// A file name from a title: "eval/icl_rare/accuracy" -> "eval-icl_rare-accuracy".
export const fileName = (title) => String(title).replace(/[^A-Za-z0-9_.-]+/g, '-').replace(/^-+|-+$/g, '') || 'data';

export function save(name, blob, text) {
  window.__downloads.push({name, type: blob.type, bytes: blob.size, text});
  const url = URL.createObjectURL(blob);
  const a = h('a', {href: url, download: name, hidden: true});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

export function saveText(name, text, type) {
  save(name, new Blob([text], {type}), text);
}

// RFC 4180: a field with a comma, quote or line break is quoted, quotes doubled.
const field = (v) => {
  const s = v === null || v === undefined ? '' : String(v);
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
};
export const csvOf = (rows) => rows.map((r) => r.map(field).join(',')).join('\n') + '\n';

// An HTML table as rows: header rows then body rows, a cell's data-value
// (the number a heatmap cell stands for) before its text.
export function tableRows(table) {
  return [...table.querySelectorAll('tr')].map(
      (tr) => [...tr.children].map((c) => (c.dataset.value !== undefined ? c.dataset.value :
                                                                          c.textContent.replace(/ [▾▴]$/, '').trim())));
}

function svgText(svg) {
  const copy = svg.cloneNode(true);
  copy.setAttribute('xmlns', 'http://www.w3.org/2000/svg');
  return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(copy);
}

// A heatmap table (cells coloured by value) as an SVG of the same grid:
// each cell its background and text, the header row and column as labels.
export function heatTableSvg(table, title) {
  const rows = [...table.querySelectorAll('tr')];
  const cols = Math.max(...rows.map((r) => r.children.length));
  const W0 = 150, CW = 64, CH = 26, top = title ? 28 : 4;
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  const W = W0 + (cols - 1) * CW + 8, H = top + rows.length * CH + 8;
  svg.setAttribute('width', W);
  svg.setAttribute('height', H);
  svg.setAttribute('font-family', 'system-ui, sans-serif');
  svg.setAttribute('font-size', '12');
  const add = (tag, attrs, text) => {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    svg.append(el);
  };
  add('rect', {x: 0, y: 0, width: W, height: H, fill: '#fff'});
  if (title) add('text', {x: 4, y: 18, 'font-weight': 'bold'}, title);
  rows.forEach((tr, j) => [...tr.children].forEach((c, i) => {
    const x = i === 0 ? 4 : W0 + (i - 1) * CW, y = top + j * CH, w = i === 0 ? W0 - 8 : CW - 2;
    const bg = getComputedStyle(c).backgroundColor;
    if (c.tagName === 'TD' && bg && bg !== 'rgba(0, 0, 0, 0)') add('rect', {x, y, width: w, height: CH - 2, fill: bg});
    const a = c.querySelector('a');
    const colour = getComputedStyle(a || c).color;
    add('text', {x: i === 0 ? x + w : x + w / 2, y: y + CH / 2 + 3, 'text-anchor': i === 0 ? 'end' : 'middle', fill: colour},
        c.textContent.trim());
  }));
  return svg;
}

// A row of download buttons; `files` maps a label ('CSV', 'PNG', 'SVG',
// 'Markdown') to a function that saves it. Buttons carry data-download.
export function downloadBar(files) {
  return h('span', {class: 'downloads'}, Object.entries(files).map(([label, fn]) => h('button', {
                                                                      type: 'button',
                                                                      class: 'download',
                                                                      'data-download': label.toLowerCase(),
                                                                      title: `download as ${label}`,
                                                                      onclick: fn,
                                                                    }, label)));
}

// A table with a CSV button above it (and SVG for a heatmap: `heat`).
export function withTableDownloads(table, title, heat = false) {
  const name = fileName(title);
  const files = {CSV: () => saveText(`${name}.csv`, csvOf(tableRows(table)), 'text/csv')};
  if (heat) files.SVG = () => saveText(`${name}.svg`, svgText(heatTableSvg(table, title)), 'image/svg+xml');
  return h('div', {class: 'downloadable'}, downloadBar(files), table);
}

export function saveSvg(svg, name) {
  saveText(`${fileName(name)}.svg`, svgText(svg), 'image/svg+xml');
}

// A canvas (and an optional title above it) as a PNG.
export function savePng(canvas, name, title) {
  const pad = title ? 24 : 0;
  const c = document.createElement('canvas');
  c.width = canvas.width;
  c.height = canvas.height + pad;
  const g = c.getContext('2d');
  g.fillStyle = '#fff';
  g.fillRect(0, 0, c.width, c.height);
  if (title) {
    g.fillStyle = '#111';
    g.font = 'bold 14px system-ui, sans-serif';
    g.fillText(title, 6, 17);
  }
  g.drawImage(canvas, 0, pad);
  c.toBlob((blob) => save(`${fileName(name)}.png`, blob));
}

// Download buttons of a bare uPlot chart `u` (a reproduction's figures): its
// data as CSV (x, then a column per series, with their labels), its canvas as PNG.
export function plotDownloads(title, u) {
  return downloadBar({
    CSV: () => {
      const rows = [u.series.map((s) => s.label)];
      for (let i = 0; i < u.data[0].length; i++) rows.push(u.data.map((col) => (col[i] === null ? '' : col[i])));
      saveText(`${fileName(title)}.csv`, csvOf(rows), 'text/csv');
    },
    PNG: () => savePng(u.ctx.canvas, title, title),
  });
}
