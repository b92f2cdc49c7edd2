// Charts: uPlot line charts with smoothing and log-scale controls, colour scales, SVG canvases.
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
    if (opts.logY) ys = ys.map((y) => (y > 0 ? y : null));
    return [s.xs, ys];
  });
  return uPlot.join(tables);
}

export class Chart {
  constructor(parent, title, opts) {
    this.title = title;
    this.opts = opts;  // shared {logY, smooth}
    this.series = [];
    this.box = h('div', {class: 'chart', 'data-chart': title}, h('h3', {}, title));
    parent.append(this.box);
    this.plot = null;
  }
  set(series) {
    this.series = series;
    this.draw();
  }
  draw() {
    const width = Math.max(320, this.box.clientWidth - 16);
    const data = chartData(this.series, this.opts);
    const labels = this.series.map((s) => s.label).join('\u0001');
    if (this.plot && this.plotLabels === labels && this.plotLog === this.opts.logY) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.plotLabels = labels;
    this.plotLog = this.opts.logY;
    this.plot = new uPlot(
        {
          width,
          height: 260,
          scales: {x: {time: false}, y: this.opts.logY ? {distr: 3} : {}},
          axes: [{label: this.opts.xLabel || 'step'}, {}],
          cursor: {sync: {key: 'circuitlab'}},
          series: [
            {label: this.opts.xLabel || 'step'}, ...this.series.map((s, i) => ({
                                                  label: s.label,
                                                  stroke: PALETTE[i % PALETTE.length],
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
