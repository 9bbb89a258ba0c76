// The Verification tab: the pending handoff's candidate and frozen checks, the adoption
// form with its reusable declarations (saved before one POST, read back after), and
// every check's result, labelled Executed or Reused prior verified result.

import { api, can, errorText, every, facts, h, newId, notice, rerender, savedDecision, savedDecisionKeys, say, seconds, session, table, when } from "./core.js";

const RESULTS_REFRESH_MS = 3000;
import { submitOnce } from "./submit.js";

export function verificationTab(runId) {
  const status = notice();
  const pending = h("section", { class: "card flow", id: "flow-verification", "aria-labelledby": "verification-title" },
    h("h2", { id: "verification-title" }, "Approve verification"), h("p", {}, "Loading…"));
  const results = h("section", { "aria-labelledby": "results-title" }, h("h2", { id: "results-title" }, "Results"));
  const body = h("div", {});
  results.append(body);
  const root = h("div", {}, pending, status, results);
  // After a submission the run's state moves on: read it again before anything else.
  const refresh = () => api("GET", `/api/v1/runs/${runId}`).then((run) => {
    loadCandidate(run, pending, status, refresh);
  }).catch((e) => {
    pending.replaceChildren(h("h2", { id: "verification-title" }, "Approve verification"),
      h("p", { class: "empty" }, e.status === 404 ? "No such run." : errorText(e)));
  });
  refresh();
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

async function loadCandidate(run, section, status, refresh) {
  const title = h("h2", { id: "verification-title" }, "Approve verification");
  const key0 = `verification.${run.run_id}.`;
  // Approvals saved in this browser can always be read back, whatever the run's state.
  const readButtons = savedDecisionKeys(key0).map((k) => h("button", { type: "button", onclick: () => readBack(run, k, status),
    "aria-label": `Read saved verification approval ${savedDecision(k)?.action_id ?? ""}`.trim() }, "Read saved verification approval"));
  if (run.state !== "awaiting_verification") {
    // Asked only while a handoff waits: the API answers 404/409 otherwise.
    section.replaceChildren(title, h("p", { class: "empty" },
      `No verification waits for approval: the run is ${run.state.replaceAll("_", " ")}.`),
    h("div", { class: "actions" }, readButtons));
    return;
  }
  let candidate;
  try {
    candidate = await api("GET", `/api/v1/runs/${run.run_id}/verification-handoffs/candidates?agent=${encodeURIComponent(run.agent)}`);
  } catch (e) {
    section.replaceChildren(title, h("p", { class: "empty" }, e.status === 404 || e.status === 409 ? `No pending verification handoff: ${e.message}` : errorText(e)));
    return;
  }
  const key = `${key0}${candidate.handoff_id}`;
  const saved = savedDecision(key);
  const parts = [title,
    facts([["Admission", h("strong", {}, candidate.admission)], ["Agent", candidate.agent],
      ["Command budget", `${candidate.budget.used_commands} used, ${candidate.budget.remaining_commands} of ${candidate.budget.max_commands} left`]]),
    candidate.holds.length ? h("ul", { class: "holds", "aria-label": "Holds" }, candidate.holds.map((x) => h("li", {}, x))) : null,
    candidate.commands.length > candidate.budget.remaining_commands
      ? h("p", { class: "notice warn" }, `${candidate.commands.length} frozen checks and ${candidate.budget.remaining_commands} commands left: the checks that are not reused must fit, or the approval is refused.`)
      : null,
    table("Frozen checks", ["#", "Command", "Purpose", "Directory"],
      candidate.commands.map((c) => [String(c.index), h("code", {}, c.arguments.join(" ")), c.purpose, c.cwd || "—"]))];
  if (saved) {
    parts.push(h("p", {}, `A verification approval is saved in this browser: ${saved.action_id}. It is never sent twice.`));
  } else if (candidate.admission === "READY" && can("operator")) {
    parts.push(adoptionForm(run, candidate, key, status, refresh));
  } else if (candidate.admission === "READY") {
    parts.push(h("p", { class: "muted" }, "Approving verification needs the operator role."));
  }
  parts.push(h("div", { class: "actions" }, readButtons));
  section.replaceChildren(...parts.filter(Boolean));
}

function adoptionForm(run, candidate, key, status, reload) {
  const choices = candidate.reusable_build_candidates.map((c) => {
    const box = h("input", { type: "checkbox", id: `reuse-${c.index}`, name: "reuse", value: c.command_digest });
    return { c, box, row: h("div", { class: "check" }, box,
      h("label", { for: `reuse-${c.index}` }, `Check ${c.index} (`, h("code", {}, c.arguments.join(" ")),
        ") tests the retained source and build inputs independently of time or external state")) };
  });
  const ack = h("input", { type: "checkbox", id: "verification-ack", name: "ack" });
  const reviewButton = h("button", { type: "button" }, "Review verification approval");
  const save = h("button", { type: "submit", class: "primary", hidden: true, disabled: true }, "Save verification approval");
  const summary = h("p", { class: "summary", "aria-live": "polite" });
  let sending = false;
  // A changed selection needs a new review.
  for (const x of choices) {
    x.box.addEventListener("change", () => {
      save.hidden = true;
      save.disabled = true;
      summary.textContent = "";
    });
  }
  reviewButton.addEventListener("click", () => {
    const selected = choices.filter((x) => x.box.checked).length;
    summary.textContent = `${candidate.commands.length} frozen checks run; ${selected} selected as reusable in later verification.`;
    save.hidden = false;
    save.disabled = sending || !ack.checked;
  });
  ack.addEventListener("change", () => { save.disabled = sending || save.hidden || !ack.checked; });
  return h("form", { class: "review", onsubmit: async (event) => {
    event.preventDefault();
    if (!ack.checked || sending || save.hidden) return;
    sending = true;
    save.disabled = true;
    for (const input of [ack, reviewButton, ...choices.map((x) => x.box)]) input.disabled = true;
    const requestId = newId();
    const body = { request_id: requestId, agent: candidate.agent, pending_request_digest: candidate.pending_request_digest,
      source_digest: candidate.source_digest, commands_digest: candidate.commands_digest, policy_digest: candidate.policy_digest,
      provider_digest: candidate.provider_digest,
      reusable_build_checks: choices.filter((x) => x.box.checked).map((x) => ({ command_digest: x.c.command_digest,
        purpose: "source_build", independent_of_time_and_external_state: true })) };
    const outcome = await submitOnce(key, { action_id: requestId, path: `/api/v1/runs/${run.run_id}/verification-handoffs/adoptions`,
      text: JSON.stringify(body) }, status, { saved: "Verification approval recorded", read: "Read saved verification approval" });
    if (outcome === "not_sent") {
      sending = false;
      for (const input of [ack, reviewButton, ...choices.map((x) => x.box)]) input.disabled = false;
      save.disabled = !ack.checked;
    }
    else reload();
  } },
  h("h3", {}, "Choose reuse"),
  choices.length ? h("fieldset", {}, h("legend", {}, "Reusable checks (leave unselected when a check needs a fresh result)"), choices.map((x) => x.row))
    : h("p", { class: "muted" }, "No check may be declared reusable."),
  reviewButton, summary,
  h("div", { class: "check" }, ack, h("label", { for: "verification-ack" }, "I approve the frozen checks and declare the selected checks independent of time and external state.")),
  save);
}

async function readBack(run, key, status) {
  const saved = savedDecision(key);
  if (!saved) return;
  try {
    const adoption = await api("GET", `/api/v1/runs/${run.run_id}/verification-handoffs/adoptions/${saved.action_id}`);
    const body = JSON.parse(saved.text);
    // Confirmed only when the record is this input, submitted by this token.
    const matches = adoption.request_id === saved.action_id && adoption.agent === body.agent
      && adoption.policy_digest === body.policy_digest && adoption.commands_digest === body.commands_digest
      && (adoption.source_digest ?? null) === (body.source_digest ?? null)
      && adoption.operator_id === session.tokenId;
    say(status, matches ? `Verification approval recorded: ${adoption.status}. Follow Results and the journal for what ran.`
      : "A record exists under the saved id, but its policy, checks or operator differ from the saved input: the outcome is unresolved.",
    matches ? "ok" : "warn");
  } catch (e) {
    say(status, e.status === 404 ? `No approval is recorded under ${saved.action_id} yet. Keep it; it is not sent again.`
      : `Could not read the saved approval: ${errorText(e)}`, e.status === 404 ? "warn" : "error");
  }
}
