// Overview: the whole fleet from the scheduler's samples (one per interval): runs
// ended per second, the queue, admission-to-start latency, what needs a person, and
// the workers, over a window kept in the address (#/overview?minutes=60).

import { api, errorText, every, h, notice, rerender, say, session } from "./core.js";
import { lineChart } from "./charts.js";

const REFRESH_MS = 10000;
// [minutes, the picker's text, how a chart's summary names the window]
const WINDOWS = [
  [15, "15 minutes", "the last 15 minutes"],
  [60, "1 hour", "the last 60 minutes"],
  [360, "6 hours", "the last 6 hours"],
  [1440, "24 hours", "the last 24 hours"],
];
// What a sample's needs_person counts; each links to those runs.
const NEEDS_A_PERSON = [
  ["needs_reconciliation", "Needs reconciliation"],
  ["stopped_at_checkpoint", "Stopped at a checkpoint"],
  ["awaiting_verification", "Awaiting verification"],
];

const needsLinks = () => h("ul", { class: "chart-links", "aria-label": "Runs that need a person, by state" },
  NEEDS_A_PERSON.map(([state, text]) => h("li", {}, h("a", { href: `#/runs?state=${state}` }, text))));

const RUNS = ["run", "runs"];
// The five charts: each series names the sample field it draws.
const CHARTS = [
  { id: "chart-runs", title: "Runs per second", unit: "runs/s", now: { field: "runs_per_second", unit: "runs/s ended" },
    series: [["Completed", "completed_per_second", "series-green"], ["Failed", "failed_per_second", "series-red dashed"]] },
  { id: "chart-queue", title: "Queue depth", unit: RUNS, now: { unit: "queued" },
    series: [["Queued", "queued", "series-blue"], ["Held by flow control", "held", "series-amber dashed"]] },
  { id: "chart-latency", title: "Admission to start", unit: "ms", now: { unit: "ms p95" },
    series: [["p95", "admission_to_start_p95_ms", "series-purple"], ["p50", "admission_to_start_p50_ms", "series-blue dashed"]] },
  { id: "chart-needs-person", title: "Needs a person", unit: RUNS, extra: needsLinks,
    series: [["Needs a person", "needs_person", "series-amber"]] },
  { id: "chart-workers", title: "Live workers", unit: ["worker", "workers"],
    series: [["Live workers", "workers", "series-blue"], ["Running runs", "running", "series-green dashed", RUNS]] },
];

const number = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

export function overviewPage(params) {
  const asked = Number(params.get("minutes"));
  let minutes = WINDOWS.some(([m]) => m === asked) ? asked : 60;
  const status = notice();
  const refreshed = h("span", { class: "refreshed" }, "Loading…");
  const picker = h("select", { id: "overview-minutes", name: "minutes", onchange: () => {
    minutes = Number(picker.value);
    // Replacing the address does not re-route: the picker keeps the keyboard's focus.
    history.replaceState(null, "", `#/overview?minutes=${minutes}`);
    refresh();
  } }, WINDOWS.map(([m, text]) => h("option", { value: m, selected: m === minutes }, text)));
  const charts = h("div", { id: "overview-charts", class: "charts" });
  const root = h("section", { class: "page" },
    h("div", { class: "heading" }, h("h1", {}, "Overview"),
      h("div", { class: "live" }, h("label", { for: "overview-minutes" }, "Window"), picker, refreshed)),
    status, charts);

  function draw(data, within) {
    const interval = (number(data.interval_seconds) || 10) * 1000;
    const to = Date.parse(data.now) || Date.now();
    const from = to - within * 60000;
    const samples = (data.samples || []).map((s) => ({ ...s, t: Date.parse(s.at) })).filter((s) => Number.isFinite(s.t));
    // A refresh rebuilds the charts: tables opened and a focused "Data" stay so.
    const open = new Set([...charts.querySelectorAll("details[open]")].map((d) => d.id));
    const active = document.activeElement;
    const focused = active && active.tagName === "SUMMARY" && charts.contains(active) ? active.parentElement.id : null;
    rerender(charts, { data, within }, () => samples.length === 0
      ? h("p", { class: "empty", id: "overview-empty" }, `No samples yet: the scheduler records one every ${interval / 1000} s.`)
      : CHARTS.map((c) => {
        const last = samples[samples.length - 1];
        const fresh = to - last.t <= 2 * interval;
        return lineChart({
          id: c.id, title: c.title, unit: c.unit, from, to, interval,
          windowText: WINDOWS.find(([m]) => m === within)[2],
          series: c.series.map(([name, field, className, unit]) => ({
            name, className, unit, points: samples.map((s) => [s.t, number(s[field])]) })),
          now: c.now && { value: c.now.field ? (fresh ? number(last[c.now.field]) : null) : undefined, unit: c.now.unit },
          extra: c.extra && c.extra(),
          open: open.has(`${c.id}-data`),
        });
      }));
    if (focused) document.getElementById(focused)?.querySelector("summary")?.focus({ preventScroll: true });
  }

  // A tenant's token: the samples span every tenant, so the API refuses them (403).
  function forbidden() {
    picker.disabled = true;
    refreshed.textContent = "";
    rerender(charts, "forbidden", () => h("p", { id: "overview-forbidden", class: "notice info" },
      "The overview shows the whole fleet: a platform token shows it. Your runs are under ",
      h("a", { href: "#/runs" }, "Runs"), "."));
  }

  let latest = 0;
  let stop = () => {};
  async function refresh() {
    const mine = ++latest;
    const within = minutes;
    try {
      const data = await api("GET", `/api/v1/overview?minutes=${within}`);
      // A window picked meanwhile has asked again: this answer is for the old one.
      if (mine !== latest) return;
      draw(data, within);
      refreshed.textContent = `Updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
      say(status, "");
    } catch (e) {
      if (mine !== latest) return;
      if (e.status === 403) {
        // Asking again changes nothing.
        stop();
        forbidden();
        return;
      }
      say(status, `Could not refresh: ${errorText(e)}`, "error");
    }
  }
  // Known from the session, it is not asked: a refused request would also be an error
  // in the browser's console.
  if (session.tenant) forbidden();
  else stop = every(REFRESH_MS, root, refresh);
  return root;
}
