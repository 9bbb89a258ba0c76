// Runs: a live list (refreshed when the scheduler's change feed says a run changed),
// searched by state, agent, labels and run id, 50 runs a page, with counts per state
// and what needs a person. The search and the page are in the address, so a view can
// be shared and survives a reload.

import { api, debounce, errorText, every, h, notice, rerender, say, stateBadge, stream, table, when } from "./core.js";

const STATES = ["queued", "running", "paused", "awaiting_verification", "stopped_at_checkpoint",
  "needs_reconciliation", "completed", "failed", "cancelled"];
const NEEDS_A_PERSON = {
  needs_reconciliation: "A step's outcome is unknown or a final report waits: decide each uncertain step (Overview), or accept a retained report (Plan tab).",
  stopped_at_checkpoint: "It stopped at a retained checkpoint: review a saved continuation (Plan tab).",
  awaiting_verification: "Its report asks for verification: adopt the frozen checks.",
};
const FILTERS = ["state", "agent", "label", "run_id"];
const PAGE_SIZE = 50;
// The feed says when to refresh; this slow one catches whatever it could not say.
const SAFETY_MS = 30000;
// Polling, as before the feed, while the feed is unavailable.
const FALLBACK_MS = 2000;
const FEED_TEXT = { connecting: "Connecting…", live: "Live", reconnecting: "Reconnecting…", ended: `Refreshed every ${FALLBACK_MS / 1000} s` };

/** The address of a view of the list: its search, and the page after `cursor`. */
function listHash(filters, cursor) {
  const q = new URLSearchParams();
  for (const key of FILTERS) if (filters[key]) q.set(key, filters[key]);
  if (cursor) q.set("cursor", cursor);
  const text = q.toString();
  return text ? `#/runs?${text}` : "#/runs";
}

function labelsOf(run) {
  const pairs = Object.entries(run.labels || {});
  return pairs.length ? pairs.map(([k, v]) => `${k}=${v}`).join(", ") : "—";
}

export function runsPage(params) {
  const filters = {
    state: STATES.includes(params.get("state")) ? params.get("state") : "",
    agent: params.get("agent") || "",
    label: params.get("label") || "",
    run_id: params.get("run_id") || "",
  };
  const cursor = params.get("cursor") || "";
  const searching = FILTERS.some((k) => filters[k]);
  const status = notice();
  const counts = h("div", { class: "counts", role: "group", "aria-label": "Runs per state" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages of runs" });
  const attention = h("section", { class: "attention", "aria-labelledby": "attention-title" });
  const list = h("div", { id: "run-list" });
  const refreshed = h("span", { class: "refreshed", "aria-live": "off", "data-feed": "connecting" }, "Loading…");
  let live = true;
  let feed = "connecting";
  let updated = null;
  const showFeed = () => {
    refreshed.dataset.feed = live ? feed : "paused";
    refreshed.textContent = live
      ? `${FEED_TEXT[feed]}${updated ? ` · updated ${updated.toLocaleTimeString()}` : ""}`
      : "Live updates paused";
  };
  const toggle = h("button", { type: "button", "aria-pressed": "true", onclick: () => {
    live = !live;
    toggle.setAttribute("aria-pressed", String(live));
    toggle.textContent = live ? "Pause live updates" : "Resume live updates";
    showFeed();
    if (live) refreshSoon.now();
  } }, "Pause live updates");

  const formError = h("p", { id: "filter-error", class: "notice error", role: "alert" });
  const field = (id, label, control) => h("div", { class: "field" }, h("label", { for: id }, label), control);
  const inputs = {
    state: h("select", { id: "filter-state", name: "state" },
      h("option", { value: "" }, "Any state"),
      STATES.map((s) => h("option", { value: s, selected: s === filters.state }, s.replaceAll("_", " ")))),
    agent: h("input", { id: "filter-agent", name: "agent", value: filters.agent, placeholder: "any agent",
      pattern: "[A-Za-z0-9._\\-]{1,128}" }),
    label: h("input", { id: "filter-label", name: "label", value: filters.label, placeholder: "k=v,k2=v2",
      spellcheck: "false", autocomplete: "off" }),
    run_id: h("input", { id: "filter-run-id", name: "run_id", value: filters.run_id, placeholder: "hex prefix",
      pattern: "[0-9a-fA-F]{4,32}", title: "4 to 32 hexadecimal characters: the start of a run id",
      spellcheck: "false", autocomplete: "off" }),
  };
  const form = h("form", { class: "filters", role: "search", "aria-label": "Search runs", onsubmit: (event) => {
    event.preventDefault();
    // A new search starts from the newest runs.
    location.hash = listHash({
      state: inputs.state.value,
      agent: inputs.agent.value.trim(),
      label: inputs.label.value.trim(),
      run_id: inputs.run_id.value.trim().toLowerCase(),
    });
  } },
  field("filter-state", "State", inputs.state),
  field("filter-agent", "Agent", inputs.agent),
  field("filter-label", "Labels", inputs.label),
  field("filter-run-id", "Run id", inputs.run_id),
  h("button", { type: "submit" }, "Filter"),
  searching ? h("a", { href: "#/runs" }, "Clear filters") : null);

  const root = h("section", { class: "page" },
    h("div", { class: "heading" }, h("h1", {}, "Runs"), h("div", { class: "live" }, refreshed, toggle)),
    form, formError, counts, attention, status, list, pager);

  /** Shows the API's refusal of a search next to the field it names. */
  function refused(e) {
    for (const [key, input] of Object.entries(inputs)) {
      if (e && e.field === key) {
        input.setAttribute("aria-invalid", "true");
        input.setAttribute("aria-describedby", "filter-error");
      } else {
        input.removeAttribute("aria-invalid");
        input.removeAttribute("aria-describedby");
      }
    }
    say(formError, e ? (e.field === "cursor" ? `This page is no longer available: ${e.message}` : errorText(e)) : "", "error");
  }

  async function refresh() {
    if (!live) return;
    const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
    for (const key of FILTERS) if (filters[key]) query.set(key, filters[key]);
    // A later page is refreshed in place: the same cursor reads the same older runs.
    if (cursor) query.set("cursor", cursor);
    const countQuery = filters.agent ? `?agent=${encodeURIComponent(filters.agent)}` : "";
    try {
      const [page, tally] = await Promise.all([
        api("GET", `/api/v1/runs?${query}`),
        api("GET", `/api/v1/runs/counts${countQuery}`),
      ]);
      rerender(counts, tally, () => STATES.map((s) => h("a", {
        class: `count${s === filters.state ? " current" : ""}`,
        href: listHash({ ...filters, state: s === filters.state ? "" : s }),
        // Named by what it shows ("queued 3"), as axe's label-content rule asks.
      }, stateBadge(s), " ", h("strong", {}, String(tally.counts[s] || 0)))));
      const waiting = Object.keys(NEEDS_A_PERSON).filter((s) => tally.counts[s] > 0);
      rerender(attention, tally, () => [
        h("h2", { id: "attention-title" }, "Needs a person"),
        waiting.length === 0
          ? h("p", { class: "empty" }, "Nothing waits for a person.")
          : h("ul", {}, waiting.map((s) => h("li", {},
            h("a", { href: listHash({ agent: filters.agent, state: s }) }, `${tally.counts[s]} ${s.replaceAll("_", " ")}`),
            ` — ${NEEDS_A_PERSON[s]}`)))]);
      const empty = searching ? "No run matches these filters."
        : cursor ? "No older runs." : "No runs yet. Submit one with cairnctl runs submit.";
      rerender(list, page.runs, () => table(cursor ? "Older runs, newest first" : "Runs, newest first",
        ["Run", "Agent", "State", "Steps", "Attempt", "Labels", "Created", "Updated"],
        page.runs.map((r) => [
          h("a", { href: `#/runs/${r.run_id}`, class: "mono" }, r.run_id),
          r.agent, stateBadge(r.state), String(r.steps.length), `${r.attempt} of ${r.max_attempts}`,
          labelsOf(r), when(r.created_at), when(r.updated_at),
        ]), empty, { stack: true }));
      rerender(pager, [cursor, page.next_cursor || ""], () => [
        cursor ? h("a", { href: listHash(filters) }, "Newest runs") : null,
        page.next_cursor ? h("a", { href: listHash(filters, page.next_cursor), rel: "next" }, "Next page") : null]);
      updated = new Date();
      showFeed();
      refused(null);
      say(status, "");
    } catch (e) {
      if (e.status === 400 && e.field) {
        refused(e);
      } else {
        say(status, `Could not refresh: ${errorText(e)}`, "error");
      }
    }
  }

  // A busy fleet changes runs all the time: the list and its counts (which count every
  // run) are read at most twice a second.
  const refreshSoon = debounce(500, refresh);
  // The first load, a slow safety refresh, and one as soon as a hidden tab is shown.
  every(SAFETY_MS, root, refreshSoon.now);
  let polling = false;
  stream("/api/v1/runs/events", {
    root,
    // `run`, `ready` (after a reconnect's replay) or `reset` (too much missed): each
    // says the list may differ. A hidden tab asks nothing; it refreshes when shown.
    onEvent: () => live && !document.hidden && refreshSoon(),
    onState: (state) => {
      feed = state;
      showFeed();
      if (state === "ended" && !polling) {
        polling = true;
        every(FALLBACK_MS, root, refreshSoon.now);
      }
    },
  });
  return root;
}
