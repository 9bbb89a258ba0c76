// One line chart, drawn as SVG (the page's CSP allows no chart library and no inline
// style: colours and dashes come from classes in charts.css). A chart says its current
// value in words too: the SVG's aria-label, a legend, and a table of its last samples.

import { h, table } from "./core.js";

const SVG = "http://www.w3.org/2000/svg";
// The drawing's own units; the SVG scales to its card's width (charts.css).
const W = 320;
const H = 150;
const LEFT = 34;
const RIGHT = 8;
const TOP = 8;
const BOTTOM = 22;
const TABLE_ROWS = 10;

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

/** A number as people read it: whole, or with the decimals its size needs; "—" for none. */
function fmt(v) {
  if (typeof v !== "number" || !Number.isFinite(v)) return "—";
  const size = Math.abs(v);
  const digits = Number.isInteger(v) || size >= 100 ? 0 : size >= 10 ? 1 : 2;
  return String(Number(v.toFixed(digits)));
}

// A unit is a string ("ms") or [one, many] (["run", "runs"]), so that 1 is "1 run".
const unitOf = (v, unit) => (Array.isArray(unit) ? unit[v === 1 ? 0 : 1] : unit);
const withUnit = (v, unit) => (typeof v === "number" && Number.isFinite(v) ? `${fmt(v)}${unit ? ` ${unitOf(v, unit)}` : ""}` : "none");

/** The smallest of 1, 2, 2.5, 5 × 10^k at or above `v`: a y-axis top with a short label. */
function niceMax(v) {
  if (!(v > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= v * (1 - 1e-9));
}

// Past half a day, a bare time of day would name two moments: the day is said too.
const clock = (t, span) => (span > 12 * 3600000
  ? new Date(t).toLocaleString([], { weekday: "short", hour: "numeric" })
  : new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }));

/**
 * A card with a title, the current value large, the chart, a legend and a "Data" table.
 * series: [{name, points: [[t ms, value|null], ...] oldest first, className, unit?}]; a
 * unit is a string or [one, many].
 * Points further apart than 1.5 × `interval` ms, or a null value, break the line: a
 * missing sample is shown missing, never interpolated. The headline is the first
 * series' latest value and unit; `now` ({value?, unit?}) overrides either. A series' latest
 * value counts as current only when it is at most two intervals older than `to`.
 * `extra`: nodes shown under the chart; `open`: whether "Data" starts open.
 */
export function lineChart({ id, title, unit = "", series, from, to, interval, windowText, now, extra, open = false }) {
  const span = Math.max(to - from, 1);
  const x = (t) => LEFT + ((t - from) / span) * (W - LEFT - RIGHT);
  const inWindow = (s) => s.points.filter(([t]) => t >= from && t <= to);
  const shown = series.map((s) => ({ ...s, unit: s.unit ?? unit, points: inWindow(s) }));
  for (const s of shown) {
    const values = s.points.map(([, v]) => v).filter((v) => typeof v === "number" && Number.isFinite(v));
    s.peak = values.length ? Math.max(...values) : null;
    const last = s.points[s.points.length - 1];
    s.now = last && to - last[0] <= 2 * interval && typeof last[1] === "number" ? last[1] : null;
  }
  const top = niceMax(Math.max(0, ...shown.map((s) => s.peak ?? 0)));
  const y = (v) => TOP + (1 - v / top) * (H - TOP - BOTTOM);

  const drawing = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img", focusable: "false",
    "aria-label": `${title} over ${windowText}: ${shown.map((s) =>
      `${shown.length > 1 ? `${s.name.toLowerCase()} ` : ""}now ${withUnit(s.now, s.unit)}, peak ${withUnit(s.peak, s.unit)}`).join("; ")}` });
  // Grid at 0, half and the top; labels at 0 and the top only.
  for (const v of [0, top / 2, top]) {
    drawing.append(svg("line", { class: v === 0 ? "chart-axis" : "chart-grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
  }
  drawing.append(
    svg("text", { x: LEFT - 4, y: y(top) + 4, "text-anchor": "end" }, fmt(top)),
    svg("text", { x: LEFT - 4, y: y(0) + 4, "text-anchor": "end" }, "0"));
  for (let i = 0; i <= 3; i += 1) {
    const t = from + (span * i) / 3;
    drawing.append(
      svg("line", { class: "chart-axis", x1: x(t), x2: x(t), y1: y(0), y2: y(0) + 4 }),
      svg("text", { x: x(t), y: H - 6, "text-anchor": i === 0 ? "start" : i === 3 ? "end" : "middle" }, clock(t, span)));
  }
  for (const s of shown) {
    // Runs of consecutive samples, each drawn as one stroke.
    const runs = [];
    let previous = null;
    for (const [t, v] of s.points) {
      const value = typeof v === "number" && Number.isFinite(v) ? v : null;
      if (value === null) {
        previous = null;
        continue;
      }
      if (previous === null || t - previous > 1.5 * interval) runs.push([]);
      runs[runs.length - 1].push([x(t), y(value)]);
      previous = t;
    }
    for (const run of runs) {
      // A lone sample has no line to draw: a dot shows it.
      drawing.append(run.length === 1
        ? svg("circle", { class: `chart-dot ${s.className}`, cx: run[0][0].toFixed(1), cy: run[0][1].toFixed(1), r: 2.5 })
        : svg("path", { class: `chart-line ${s.className}`,
          d: run.map(([px, py], i) => `${i ? "L" : "M"}${px.toFixed(1)} ${py.toFixed(1)}`).join("") }));
    }
  }

  const headline = { value: now?.value === undefined ? shown[0].now : now.value, unit: now?.unit ?? shown[0].unit };
  const times = [...new Set(shown.flatMap((s) => s.points.map(([t]) => t)))].sort((a, b) => b - a).slice(0, TABLE_ROWS);
  const byTime = shown.map((s) => new Map(s.points));
  const caption = `${title}: the last ${times.length} samples, newest first`;
  return h("section", { class: "card chart", id, "aria-labelledby": `${id}-title` },
    h("div", { class: "chart-head" },
      h("h2", { id: `${id}-title` }, title),
      h("p", { class: "chart-now" }, h("span", { class: "chart-now-value" }, fmt(headline.value)),
        headline.unit ? [" ", h("span", { class: "chart-now-unit" }, unitOf(headline.value, headline.unit))] : null)),
    drawing,
    h("ul", { class: "chart-legend" }, shown.map((s) => h("li", {},
      svg("svg", { class: "chart-swatch", viewBox: "0 0 20 6", "aria-hidden": "true", focusable: "false" },
        svg("line", { class: `chart-line ${s.className}`, x1: 1, x2: 19, y1: 3, y2: 3 })),
      `${s.name}: ${s.now === null ? "—" : withUnit(s.now, s.unit)}`))),
    extra || null,
    h("details", { id: `${id}-data`, open },
      h("summary", {}, "Data"),
      table(caption, ["Time", ...shown.map((s) => `${s.name}${s.unit ? ` (${unitOf(2, s.unit)})` : ""}`)],
        times.map((t) => [new Date(t).toLocaleTimeString(), ...byTime.map((m) => fmt(m.get(t)))]),
        "No samples in this window.")));
}
