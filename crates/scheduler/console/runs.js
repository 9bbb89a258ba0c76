// Runs: a live list (polled every 2 s, with the time of the last refresh shown),
// filters by state and agent, counts per state, and what needs a person.

import { api, errorText, every, h, notice, rerender, say, stateBadge, table, when } from "./core.js";

const STATES = ["queued", "running", "paused", "awaiting_verification", "stopped_at_checkpoint",
  "needs_reconciliation", "completed", "failed", "cancelled"];
const NEEDS_A_PERSON = {
  needs_reconciliation: "A step's outcome is unknown or a final report waits: decide each uncertain step (Overview), or accept a retained report (Plan tab).",
  stopped_at_checkpoint: "It stopped at a retained checkpoint: review a saved continuation (Plan tab).",
  awaiting_verification: "Its report asks for verification: adopt the frozen checks.",
};
const REFRESH_MS = 2000;

function filterHash(state, agent) {
  const q = new URLSearchParams();
  if (state) q.set("state", state);
  if (agent) q.set("agent", agent);
  const text = q.toString();
  return text ? `#/runs?${text}` : "#/runs";
}

export function runsPage(params) {
  const state = STATES.includes(params.get("state")) ? params.get("state") : "";
  const agent = params.get("agent") || "";
  const status = notice();
  const counts = h("div", { class: "counts", role: "group", "aria-label": "Runs per state" });
  const more = h("p", { class: "muted" });
  const attention = h("section", { class: "attention", "aria-labelledby": "attention-title" });
  const list = h("div", { id: "run-list" });
  const refreshed = h("span", { class: "refreshed", "aria-live": "off" }, "Loading…");
  let live = true;
  const toggle = h("button", { type: "button", "aria-pressed": "true", onclick: () => {
    live = !live;
    toggle.setAttribute("aria-pressed", String(live));
    toggle.textContent = live ? "Pause live updates" : "Resume live updates";
    if (!live) refreshed.textContent = "Live updates paused";
  } }, "Pause live updates");

  const stateSelect = h("select", { id: "filter-state", name: "state" },
    h("option", { value: "" }, "Any state"),
    STATES.map((s) => h("option", { value: s, selected: s === state }, s.replaceAll("_", " "))));
  const agentInput = h("input", { id: "filter-agent", name: "agent", value: agent, placeholder: "any agent",
    pattern: "[A-Za-z0-9._\\-]{1,128}" });
  const filters = h("form", { class: "filters", role: "search", onsubmit: (event) => {
    event.preventDefault();
    location.hash = filterHash(stateSelect.value, agentInput.value.trim());
  } },
  h("label", { for: "filter-state" }, "State"), stateSelect,
  h("label", { for: "filter-agent" }, "Agent"), agentInput,
  h("button", { type: "submit" }, "Filter"),
  (state || agent) ? h("a", { href: "#/runs" }, "Clear filters") : null);

  const root = h("section", { class: "page" },
    h("div", { class: "heading" }, h("h1", {}, "Runs"), h("div", { class: "live" }, refreshed, toggle)),
    filters, counts, attention, status, list, more);

  async function refresh() {
    if (!live) return;
    const query = new URLSearchParams({ limit: "100" });
    if (state) query.set("state", state);
    if (agent) query.set("agent", agent);
    const countQuery = agent ? `?agent=${encodeURIComponent(agent)}` : "";
    try {
      const [page, tally] = await Promise.all([
        api("GET", `/api/v1/runs?${query}`),
        api("GET", `/api/v1/runs/counts${countQuery}`),
      ]);
      rerender(counts, tally, () => STATES.map((s) => h("a", {
        class: `count${s === state ? " current" : ""}`, href: filterHash(s === state ? "" : s, agent),
        "aria-label": `${tally.counts[s] || 0} ${s.replaceAll("_", " ")}`,
      }, stateBadge(s), h("strong", {}, String(tally.counts[s] || 0)))));
      const waiting = Object.keys(NEEDS_A_PERSON).filter((s) => tally.counts[s] > 0);
      rerender(attention, tally, () => [
        h("h2", { id: "attention-title" }, "Needs a person"),
        waiting.length === 0
          ? h("p", { class: "empty" }, "Nothing waits for a person.")
          : h("ul", {}, waiting.map((s) => h("li", {},
            h("a", { href: filterHash(s, agent) }, `${tally.counts[s]} ${s.replaceAll("_", " ")}`),
            ` — ${NEEDS_A_PERSON[s]}`)))]);
      rerender(list, page.runs, () => table("Runs, newest first", ["Run", "Agent", "State", "Steps", "Attempt", "Created", "Updated"],
        page.runs.map((r) => [
          h("a", { href: `#/runs/${r.run_id}`, class: "mono" }, r.run_id),
          r.agent, stateBadge(r.state), String(r.steps.length), `${r.attempt} of ${r.max_attempts}`,
          when(r.created_at), when(r.updated_at),
        ]), state || agent ? "No run matches these filters." : "No runs yet. Submit one with cairnctl runs submit."));
      more.textContent = page.next_cursor ? "Only the newest 100 runs are listed: filter by state or agent to find older ones." : "";
      refreshed.textContent = `Updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
      say(status, "");
    } catch (e) {
      say(status, `Could not refresh: ${errorText(e)}`, "error");
    }
  }
  every(REFRESH_MS, root, refresh);
  return root;
}
