/**
 * Small dependency-free SVG charts for the Markdown reports: grouped bars (ours against a
 * peer) and lines (a percentile over time). Plain SVG 1.1 that GitHub renders inline.
 */
export interface Bar {
  label: string;
  value: number;
  /** Who the bar measures: 'ours', a peer's name, 'floor'. Colours follow it. */
  who: string;
}

export interface Series {
  name: string;
  points: readonly (readonly [number, number])[];
}

export type Chart =
  | { kind: 'bars'; file: string; title: string; unit: string; bars: Bar[] }
  | { kind: 'lines'; file: string; title: string; unit: string; xLabel: string; series: Series[] };

const PALETTE = ['#2b6cb0', '#c05621', '#2f855a', '#6b46c1', '#b83280', '#718096'];
const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const fmt = (v: number) =>
  !Number.isFinite(v)
    ? 'n/a'
    : Math.abs(v) >= 100_000
      ? `${(v / 1000).toFixed(0)}k`
      : Math.abs(v) >= 100
        ? v.toFixed(0)
        : Math.abs(v) >= 1
          ? v.toFixed(2)
          : v.toPrecision(2);

export function renderChart(chart: Chart): string {
  return chart.kind === 'bars' ? bars(chart) : lines(chart);
}

function colourOf(who: string, order: string[]): string {
  if (!order.includes(who)) order.push(who);
  return PALETTE[order.indexOf(who) % PALETTE.length] as string;
}

function bars(c: Extract<Chart, { kind: 'bars' }>): string {
  const rowH = 26;
  const left = 230;
  const width = 720;
  const plotW = width - left - 90;
  const top = 40;
  const height = top + c.bars.length * rowH + 20;
  const max = Math.max(...c.bars.map((b) => (Number.isFinite(b.value) ? b.value : 0)), 1e-9);
  const order: string[] = [];
  const rows = c.bars.map((b, i) => {
    const y = top + i * rowH;
    const w = Number.isFinite(b.value) ? Math.max(1, (b.value / max) * plotW) : 0;
    return [
      `<text x="${left - 8}" y="${y + 17}" text-anchor="end">${esc(`${b.label} (${b.who})`)}</text>`,
      `<rect x="${left}" y="${y + 4}" width="${w.toFixed(1)}" height="${rowH - 8}" fill="${colourOf(b.who, order)}"/>`,
      `<text x="${left + w + 6}" y="${y + 17}">${fmt(b.value)}</text>`,
    ].join('');
  });
  return svg(width, height, c.title, [
    `<text x="10" y="22" font-weight="bold">${esc(c.title)} (${esc(c.unit)})</text>`,
    ...rows,
  ]);
}

function lines(c: Extract<Chart, { kind: 'lines' }>): string {
  const width = 720;
  const height = 320;
  const pad = { l: 60, r: 20, t: 40, b: 60 };
  const all = c.series.flatMap((s) => s.points).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  const maxX = Math.max(...all.map((p) => p[0]), 1e-9);
  const maxY = Math.max(...all.map((p) => p[1]), 1e-9);
  const X = (x: number) => pad.l + (x / maxX) * (width - pad.l - pad.r);
  const Y = (y: number) => height - pad.b - (y / maxY) * (height - pad.t - pad.b);
  const order: string[] = [];
  const parts = [
    `<text x="10" y="22" font-weight="bold">${esc(c.title)} (${esc(c.unit)})</text>`,
    `<line x1="${pad.l}" y1="${height - pad.b}" x2="${width - pad.r}" y2="${height - pad.b}" stroke="#999"/>`,
    `<line x1="${pad.l}" y1="${pad.t}" x2="${pad.l}" y2="${height - pad.b}" stroke="#999"/>`,
    `<text x="${pad.l - 6}" y="${pad.t + 4}" text-anchor="end">${fmt(maxY)}</text>`,
    `<text x="${pad.l - 6}" y="${height - pad.b}" text-anchor="end">0</text>`,
    `<text x="${width - pad.r}" y="${height - pad.b + 16}" text-anchor="end">${fmt(maxX)}</text>`,
    `<text x="${(width + pad.l) / 2}" y="${height - pad.b + 16}" text-anchor="middle">${esc(c.xLabel)}</text>`,
  ];
  c.series.forEach((s, i) => {
    const colour = colourOf(s.name, order);
    const pts = s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
    if (pts.length) {
      parts.push(
        `<polyline fill="none" stroke="${colour}" stroke-width="2" points="${pts.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(' ')}"/>`,
      );
    }
    parts.push(
      `<rect x="${pad.l + i * 150}" y="${height - 26}" width="12" height="12" fill="${colour}"/>`,
      `<text x="${pad.l + i * 150 + 16}" y="${height - 16}">${esc(s.name)}</text>`,
    );
  });
  return svg(width, height, c.title, parts);
}

function svg(width: number, height: number, title: string, parts: string[]): string {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<title>${esc(title)}</title>`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    ...parts,
    '</svg>',
    '',
  ].join('\n');
}
