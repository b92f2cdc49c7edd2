// Charts: uPlot line charts with smoothing and log-scale controls (a series
// may sit on its own right-hand axis), colour scales, SVG canvases.
import {csvOf, downloadBar, fileName, save, saveText} from './downloads.js';
import {PALETTE, fmt, h} from './util.js';

// Exponential moving average, debiased at the start (as TensorBoard's).
export function smooth(ys, weight) {
  if (!weight) return ys;
  let s = 0, n = 0;
  return ys.map((y) => {
    if (y === null || !isFinite(y)) return y;
    n += 1;
    s = weight * s + (1 - weight) * y;
    return s / (1 - Math.pow(weight, n));
  });
}

// series: [{label, xs, ys}] with their own x values; aligned with uPlot.join.
function chartData(series, opts) {
  if (!series.length) return [[]];
  const tables = series.map((s) => {
    let ys = smooth(s.ys, opts.smooth);
    if (opts.logY && s.axis !== 'right') ys = ys.map((y) => (y > 0 ? y : null));
    return [s.xs, ys];
  });
  return uPlot.join(tables);
}

// series: [{label, xs, ys, axis?, color?, dash?}]: `axis: 'right'` puts a
// series on a second scale with its own axis on the right (opts.rightLabel
// names it: a quantity of another range, such as rho in [0, 1] beside the
// coordinates' 0-10), `color`/`dash` override the palette's colour and a
// solid line. opts: {logY, smooth, xLabel} shared by a page's charts;
// axes: {yLabel, rightLabel, rightRange} this chart's own. The log scale applies to the
// left axis. Each chart offers its data as CSV (the
// values as recorded, not smoothed) and its picture as PNG.
export class Chart {
  constructor(parent, title, opts, axes) {
    this.title = title;
    this.opts = opts;  // shared {logY, smooth}
    this.axes = axes || {};
    this.series = [];
    this.heading = h('h3', {}, title);
    this.box = h('div', {class: 'chart', 'data-chart': title},
                 h('div', {class: 'chart-head'}, this.heading,
                   downloadBar({CSV: () => this.saveCsv(), PNG: () => this.savePng()})));
    parent.append(this.box);
    this.plot = null;
  }
  rename(title) {
    this.title = title;
    this.heading.textContent = title;
    this.box.dataset.chart = title;
  }
  set(series) {
    this.series = series;
    this.draw();
  }
  // x, then one column per series: the recorded values.
  csvRows() {
    const joined = this.series.length ? uPlot.join(this.series.map((s) => [s.xs, s.ys])) : [[]];
    const rows = [[this.opts.xLabel || 'step', ...this.series.map((s) => s.label)]];
    for (let i = 0; i < joined[0].length; i++) rows.push(joined.map((col) => (col[i] === null ? '' : col[i])));
    return rows;
  }
  saveCsv() {
    saveText(`${fileName(this.title)}.csv`, csvOf(this.csvRows()), 'text/csv');
  }
  // The plot with its title above and its legend (colour, dash, label) below.
  savePng() {
    if (!this.plot) return;
    const src = this.plot.ctx.canvas, ratio = src.width / this.plot.width;
    const lineH = 18 * ratio, top = 26 * ratio;
    const c = document.createElement('canvas');
    c.width = src.width;
    c.height = top + src.height + lineH * (this.series.length + 1);
    const g = c.getContext('2d');
    g.fillStyle = '#fff';
    g.fillRect(0, 0, c.width, c.height);
    g.fillStyle = '#111';
    g.font = `bold ${14 * ratio}px system-ui, sans-serif`;
    g.fillText(this.title, 6 * ratio, 18 * ratio);
    g.drawImage(src, 0, top);
    g.font = `${12 * ratio}px system-ui, sans-serif`;
    this.series.forEach((s, i) => {
      const y = top + src.height + lineH * (i + 1);
      g.strokeStyle = s.color || PALETTE[i % PALETTE.length];
      g.lineWidth = 2 * ratio;
      g.setLineDash((s.dash || []).map((d) => d * ratio));
      g.beginPath();
      g.moveTo(10 * ratio, y - 4 * ratio);
      g.lineTo(40 * ratio, y - 4 * ratio);
      g.stroke();
      g.setLineDash([]);
      g.fillStyle = '#111';
      g.fillText(s.label + (s.axis === 'right' ? ` (right axis${this.axes.rightLabel ? ': ' + this.axes.rightLabel : ''})` : ''),
                 48 * ratio, y);
    });
    c.toBlob((blob) => save(`${fileName(this.title)}.png`, blob));
  }
  draw() {
    const width = Math.max(320, this.box.clientWidth - 16);
    const data = chartData(this.series, this.opts);
    const labels = this.series.map((s) => `${s.label}|${s.axis || ''}|${s.color || ''}|${s.dash || ''}`).join('\u0001');
    if (this.plot && this.plotLabels === labels && this.plotLog === this.opts.logY) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.plotLabels = labels;
    this.plotLog = this.opts.logY;
    const right = this.series.some((s) => s.axis === 'right');
    const scales = {x: {time: false}, y: this.opts.logY ? {distr: 3} : {}};
    const axes = [{label: this.opts.xLabel || 'step'}, {label: this.axes.yLabel}];
    if (right) {
      // rightRange [lo, hi]: the right axis spans at least it (rho: [0, 1]).
      const want = this.axes.rightRange;
      scales.r = want ? {range: (u, lo, hi) => [Math.min(want[0], lo), Math.max(want[1], hi)]} : {};
      axes.push({scale: 'r', side: 1, label: this.axes.rightLabel, grid: {show: false}});
    }
    this.plot = new uPlot(
        {
          width,
          height: 260,
          scales,
          axes,
          cursor: {sync: {key: 'circuitlab'}},
          series: [
            {label: this.opts.xLabel || 'step'}, ...this.series.map((s, i) => ({
                                                  label: s.label,
                                                  scale: s.axis === 'right' ? 'r' : 'y',
                                                  stroke: s.color || PALETTE[i % PALETTE.length],
                                                  dash: s.dash,
                                                  width: 1.5,
                                                  spanGaps: true,
                                                  value: (u, v) => fmt(v),
                                                }))
          ],
        },
        data, this.box);
    window.__charts[this.title] = this.plot;
  }
}

export function chartControls(opts, redraw) {
  const log = h('input', {type: 'checkbox', checked: opts.logY});
  log.addEventListener('change', () => {
    opts.logY = log.checked;
    redraw();
  });
  const sm = h('input', {type: 'range', min: 0, max: 0.99, step: 0.01, value: opts.smooth});
  const smLabel = h('span', {}, String(opts.smooth));
  sm.addEventListener('input', () => {
    opts.smooth = Number(sm.value);
    smLabel.textContent = sm.value;
    redraw();
  });
  return h('div', {class: 'filters'}, h('label', {}, log, ' log y'), h('label', {}, 'smoothing ', sm, ' ', smLabel));
}

// "eval/icl_rare/accuracy" -> the chart it goes on.
export function groupOf(name) {
  if (name.startsWith('manifold/')) return 'coordinates';
  if (name.startsWith('tv/')) return 'task vectors: ' + name.split('/')[1];
  const parts = name.split('/');
  return parts[parts.length - 1];
}

// A colour bar: `lo` and `hi` at the ends of a ramp drawn by `scale(t)`,
// t in [0, 1], with `label` (the quantity) before it.
export function colorBar(lo, hi, scale, label, id) {
  const c = h('canvas', {width: 200, height: 12, id});
  const g = c.getContext('2d');
  for (let i = 0; i < 200; i++) {
    g.fillStyle = scale(i / 199);
    g.fillRect(i, 0, 1, 12);
  }
  return h('div', {class: 'colorbar', 'data-label': label}, h('span', {}, label), h('span', {}, fmt(lo)), c,
           h('span', {}, fmt(hi)));
}

export function colorScale(t) {  // 0..1 -> a blue-to-yellow ramp (viridis-like)
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const x = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

export const textOn = (rgb) => {
  const [r, g, b] = rgb.match(/\d+/g).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b > 140 ? '#111' : '#fff';
};

export function hexToRgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return `rgb(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255})`;
}

// An SVG element of W x H with `id`, and add(tag, attrs, text) appending a
// child element (returned) to it.
export function svgCanvas(W, H, id) {
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('width', W);
  svg.setAttribute('height', H);
  svg.setAttribute('id', id);
  const add = (tag, attrs, text) => {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    svg.append(el);
    return el;
  };
  return [svg, add];
}
