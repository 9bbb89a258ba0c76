// The Agent questions tab: Approve factory verification. Choose the coding provider,
// read the approved (frozen) checks, choose which are reusable (numbered from 1),
// review, then save the approval once with its identity and exact input kept in
// browser storage first; read it back after an uncertain answer or a reload.

import { api, can, errorText, facts, h, newId, notice, savedDecision, savedDecisionKeys, say, session, table } from "./core.js";
import { submitOnce } from "./submit.js";

// The providers a verification may name; the run's own agent is the configured one.
const PROVIDERS = ["agentic", "bridge", "codex", "claude"];
// These run a coding CLI with the factory's credentials: an administrator approves.
const ADMIN_PROVIDERS = ["codex", "claude"];

export function questionsTab(runId) {
  const status = notice();
  const section = h("section", { class: "card flow", id: "flow-verification", "aria-labelledby": "verification-title" },
    h("h2", { id: "verification-title" }, "Approve factory verification"), h("p", {}, "Loading…"));
  const root = h("div", {}, section, status);
  // After a submission the run's state moves on: read it again before anything else.
  const refresh = () => api("GET", `/api/v1/runs/${runId}`).then((run) => start(run, section, status, refresh)).catch((e) => {
    section.replaceChildren(h("h2", { id: "verification-title" }, "Approve factory verification"),
      h("p", { class: "empty" }, e.status === 404 ? "No such run." : errorText(e)));
  });
  refresh();
  return root;
}

function start(run, section, status, refresh) {
  const title = h("h2", { id: "verification-title" }, "Approve factory verification");
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
  const providers = [...new Set([run.agent, ...PROVIDERS])];
  const provider = h("select", { id: "verification-provider", name: "provider" },
    providers.map((p) => h("option", { value: p, selected: p === run.agent }, p === run.agent ? `${p} (the run's agent)` : p)));
  const area = h("div", {});
  const read = h("button", { type: "button", onclick: () => loadCandidate(run, provider.value, area, status, refresh) }, "Read approved checks");
  section.replaceChildren(title,
    h("p", { class: "muted" }, "The run's accepted report asks for verification of frozen checks. Approving runs every one of them; a selection only permits reuse in later verification."),
    h("div", { class: "check" }, h("label", { for: "verification-provider" }, "Coding provider"), provider),
    h("div", { class: "actions" }, read), area,
    h("div", { class: "actions" }, readButtons));
}

/** Reads the candidate for `provider` and shows its frozen checks and the form. */
async function loadCandidate(run, provider, area, status, refresh) {
  if (provider !== run.agent) {
    // Said before any request: a verification runs under the run's own agent.
    area.replaceChildren(h("p", { class: "notice warn", role: "status" },
      `${provider} is not this run's configured provider: verification runs under the run's own agent (${run.agent}).`));
    return;
  }
  let candidate;
  try {
    candidate = await api("GET", `/api/v1/runs/${run.run_id}/verification-handoffs/candidates?agent=${encodeURIComponent(provider)}`);
  } catch (e) {
    area.replaceChildren(h("p", { class: "notice warn", role: "status" }, e.status === 404 || e.status === 409 ? `No pending verification handoff: ${e.message}` : errorText(e)));
    return;
  }
  const key = `verification.${run.run_id}.${candidate.handoff_id}`;
  const saved = savedDecision(key);
  const role = ADMIN_PROVIDERS.includes(candidate.agent) ? "admin" : "operator";
  const parts = [
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
  } else if (candidate.admission === "READY" && can(role)) {
    parts.push(adoptionForm(run, candidate, key, status, refresh, area));
  } else if (candidate.admission === "READY") {
    parts.push(h("p", { class: "muted" }, `Approving verification under the ${candidate.agent} provider needs the ${role} role.`));
  }
  area.replaceChildren(...parts.filter(Boolean));
}

function adoptionForm(run, candidate, key, status, reload, area) {
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
    } else if (outcome === "refused") {
      // An access refusal (or another) clears the private review; nothing was saved.
      area.replaceChildren();
    } else reload();
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
