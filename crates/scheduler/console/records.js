// The journal's records beside the steps, in the Plan tab: what accepted a report, what
// a verification reused and completed, the finishing round and the terminal acceptance,
// holds, and failed steps' trees kept for inspection. Each as a sentence, its raw JSON
// one click away. And the steps' receipts as a table (receipts()), for the run page.

import { api, errorText, h, seconds, stateBadge, table, when } from "./core.js";

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

/** A record's raw JSON, one click away: every readable table's last cell. */
export function rawJson(value, label) {
  return h("details", {}, h("summary", {}, "JSON"),
    h("pre", { class: "json", tabindex: "0", "aria-label": label }, JSON.stringify(value, null, 2)));
}

export function records(runId) {
  const root = h("section", { class: "card", id: "records", "aria-labelledby": "records-title" },
    h("h2", { id: "records-title" }, "Records"), h("p", {}, "Loading…"));
  api("GET", `/api/v1/runs/${runId}/journal`).then((journal) => {
    const rows = (journal.entries || []).map((e) => [
      `#${e.id}`,
      (SAYS[e.entry_kind] || (() => e.entry_kind.replaceAll("_", " ")))(e.body || {}),
      when(e.created_at),
      rawJson(e.body, `Record ${e.id}`),
    ]);
    root.replaceChildren(root.firstChild,
      h("p", { class: "muted" }, "A record says what was accepted or reused; it establishes no successful run, commit or pull request on its own."),
      table("The run's journal records, oldest first", ["Record", "What it says", "When", "Raw"], rows, "No record yet."));
  }).catch((e) => root.replaceChildren(root.firstChild, h("p", { class: "notice error", role: "status" }, errorText(e))));
  return root;
}

// How a step ended, beyond its status: what its receipt recorded.
function outcome(s) {
  const detail = {
    completed: () => "exit 0",
    failed: () => [s.exit_code !== null && s.exit_code !== undefined ? `exit ${s.exit_code}` : null,
      s.signal ? `signal ${s.signal}` : null, s.timed_out ? "timed out" : null,
      s.limit ? `passed its ${s.limit.replaceAll("_", " ")}` : null].filter(Boolean).join(", "),
    cancelled: () => "its run was cancelled",
    marked_done: () => "a person decided its effect happened",
    unknown_outcome: () => "it started; its end was not recorded",
  }[s.status];
  const text = detail ? detail() : "";
  return [stateBadge(s.status), text ? `: ${text}` : null];
}

function receiptRows(steps) {
  return steps.map((s) => [
    s.step_key,
    [`attempt ${s.intent_attempt}, epoch ${s.intent_epoch}`, s.worker ? ` on ${s.worker}` : null,
      // A receipt written under a later lease than its intent: a worker took it over.
      s.receipt_epoch !== null && s.receipt_epoch !== undefined && s.receipt_epoch !== s.intent_epoch ? `; receipt at epoch ${s.receipt_epoch}` : null],
    outcome(s),
    seconds(s.wall_ms),
    seconds(s.cpu_ms),
    when(s.started_at),
    when(s.finished_at),
    s.snapshot_id || s.tree_tier
      ? [s.tree_tier ? `${s.tree_tier} tree` : "tree", s.snapshot_id ? [", snapshot ", h("span", { class: "mono" }, s.snapshot_id)] : null]
      : "—",
    rawJson(s, `Step ${s.step_key}, attempt ${s.intent_attempt}, epoch ${s.intent_epoch}`),
  ]);
}

/**
 * The journal's steps, one row per intent with its receipt: attempt and epoch, outcome,
 * wall and CPU time, when, and the tree and snapshot. Given the `journal` the page
 * already read, it draws at once; without it, it reads the journal itself.
 */
export function receipts(runId, { journal } = {}) {
  const root = h("section", { class: "card", id: "receipts", "aria-labelledby": "receipts-title" },
    h("h2", { id: "receipts-title" }, "Receipts"));
  const draw = (j) => root.replaceChildren(root.firstChild,
    h("p", { class: "muted" }, "A step's intent is written when it starts, its receipt when it ends; a step without a receipt has an unknown outcome."),
    table("Each step's intent and receipt, in admission and step order", ["Step", "Attempt", "Outcome", "Wall", "CPU", "Started", "Ended", "Tree", "Raw"],
      receiptRows(j.steps || []), "No step has started."));
  if (journal) {
    draw(journal);
  } else {
    root.append(h("p", {}, "Loading…"));
    api("GET", `/api/v1/runs/${runId}/journal`).then(draw)
      .catch((e) => root.replaceChildren(root.firstChild, h("p", { class: "notice error", role: "status" }, errorText(e))));
  }
  return root;
}
