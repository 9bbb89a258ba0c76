// The Verification tab: every check's result of every adoption, labelled Executed or
// Reused prior verified result, with where a reused one came from. Approving a
// verification is on the Agent questions tab.

import { api, errorText, every, facts, h, rerender, seconds, table, when } from "./core.js";

const RESULTS_REFRESH_MS = 3000;

export function verificationTab(runId) {
  const results = h("section", { "aria-labelledby": "results-title" }, h("h2", { id: "results-title" }, "Results"));
  const body = h("div", {});
  results.append(body);
  const root = h("div", {}, results);
  // Results move while checks run: read again every 3 s, re-rendered only on change.
  every(RESULTS_REFRESH_MS, root, () => loadResults(runId, body));
  return root;
}

async function loadResults(runId, section) {
  try {
    const list = await api("GET", `/api/v1/runs/${runId}/verification-handoffs/adoptions`);
    rerender(section, list, () => list.adoptions.length === 0
      ? h("p", { class: "empty" }, "No verification was adopted for this run.")
      : list.adoptions.map((a) => h("article", { class: "adoption" },
      h("h3", {}, "Adoption ", h("span", { class: "mono" }, a.request_id)),
      facts([["Status", a.status], ["Handoff", a.handoff_state], ["Adopted", when(a.created_at)]]),
      table(`Checks of adoption ${a.request_id}`, ["#", "Result", "Passed", "Exit", "Wall", "Finished", "Where it came from"],
        a.results.map((r) => [String(r.index), h("strong", { class: r.reused ? "reused" : "executed" }, r.display),
          r.passed ? "passed" : "failed", r.exit_code === null ? "—" : String(r.exit_code), seconds(r.wall_ms), when(r.finished_at),
          r.source_execution
            ? `reused from result ${r.source_execution.result_id} (request ${r.source_execution.request_id || "—"}${r.source_execution.step_key ? `, ${r.source_execution.step_key}` : ""}, attempt ${r.source_execution.attempt}, epoch ${r.source_execution.lease_epoch}); not run again`
            : `executed in attempt ${r.attempt}${r.fresh_reason ? `; fresh because ${r.fresh_reason.replaceAll("_", " ")}` : ""}`]),
        "No check has a result yet."),
      // A reused result keeps its original output: shown as recorded.
      a.results.map((r) => h("details", {},
        h("summary", {}, `Check ${r.index} output (${r.reused ? "from its original execution" : "as it ran"})`),
        h("pre", { class: "tail", tabindex: "0", "aria-label": `Check ${r.index} stdout` }, r.stdout_tail || "(no stdout)"),
        r.stderr_tail ? h("pre", { class: "tail err", tabindex: "0", "aria-label": `Check ${r.index} stderr` }, r.stderr_tail) : null)))));
  } catch (e) {
    rerender(section, { error: errorText(e) }, () => h("p", { class: "notice error" }, errorText(e)));
  }
}
