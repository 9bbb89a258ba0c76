// The journal's records beside the steps, in the Plan tab: what accepted a report, what
// a verification reused and completed, the finishing round and the terminal acceptance,
// holds, and failed steps' trees kept for inspection. Each as a sentence, its raw JSON
// one click away.

import { api, errorText, h, table, when } from "./core.js";

const short = (digest) => (typeof digest === "string" ? `${digest.slice(0, 12)}…` : "—");
const list = (items) => (items && items.length ? items.join(", ") : "none");

// What each record says, by its kind; kinds not listed here are shown by name.
const SAYS = {
  final_report_accepted: (b) => `Saved result accepted: ${b.outcome}${b.followup_kind ? `, next step: ${b.followup_kind}` : ""}; report ${short(b.report_digest)}`,
  verification_build_scope: () => "Verification scope witnessed before the checks ran",
  verification_reuse_intent: (b) => `Reuse intent for checks ${list((b.checks || []).map((c) => c.index))}`,
  verification_reuse_receipt: (b) => `Reuse receipt: New executions for referenced checks: ${b.new_execution_count} (checks ${list((b.checks || []).map((c) => c.index))}); completion receipt #${b.completion_receipt}`,
  verification_completion: (b) => `Verification ${b.passed ? "passed" : "failed"}: ${b.checks} checks, ${b.reused_checks} reused, ${b.fresh_checks} run`,
  finishing_round: (b) => `Finishing round: ${b.usage?.commands ?? 0} commands, files written: ${list(b.usage?.files_written)}; retained source ${short(b.usage?.retained_source?.source_digest)}`,
  terminal_acceptance: (b) => `Terminal acceptance: final-result receipt #${b.final_result_receipt}, ${(b.command_receipts || []).length} command receipts, source ${short(b.source_digest)}`,
  finishing_round_held: (b) => `Finishing round held: ${list((b.holds || []).map((x) => x.reason.replaceAll("_", " ")))}`,
  reconciliation_decision: (b) => `Step ${b.step_key} ${String(b.decision).replaceAll("_", " ")} by ${b.decided_by_name}: “${b.reason}”; the run ${b.outcome === "queued" ? "continued" : b.outcome}`,
  inspection_snapshot: (b) => `Step ${b.step_key} failed; its tree is kept for inspection as snapshot ${b.snapshot_id}`,
};

export function records(runId) {
  const root = h("section", { class: "card", id: "records", "aria-labelledby": "records-title" },
    h("h2", { id: "records-title" }, "Records"), h("p", {}, "Loading…"));
  api("GET", `/api/v1/runs/${runId}/journal`).then((journal) => {
    const rows = (journal.entries || []).map((e) => [
      `#${e.id}`,
      (SAYS[e.entry_kind] || (() => e.entry_kind.replaceAll("_", " ")))(e.body || {}),
      when(e.created_at),
      h("details", {}, h("summary", {}, "JSON"),
        h("pre", { class: "json", tabindex: "0", "aria-label": `Record ${e.id}` }, JSON.stringify(e.body, null, 2))),
    ]);
    root.replaceChildren(root.firstChild,
      h("p", { class: "muted" }, "A record says what was accepted or reused; it establishes no successful run, commit or pull request on its own."),
      table("The run's journal records, oldest first", ["Record", "What it says", "When", "Raw"], rows, "No record yet."));
  }).catch((e) => root.replaceChildren(root.firstChild, h("p", { class: "notice error", role: "status" }, errorText(e))));
  return root;
}
