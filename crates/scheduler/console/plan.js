// The Plan tab: Saved continuation (a checkpoint continuation) and Saved agent result
// (a final-outcome continuation), each the seed's flow: check, review, acknowledge,
// submit once with the decision saved first, and read the saved action back; then the
// run's publication and delivery hold, and the journal's records.

import { api, can, errorText, facts, forgetDecision, h, markDecision, newId, notice, savedDecision, say, seconds, stateBadge, when } from "./core.js";
import { publication } from "./publish.js";
import { records } from "./records.js";
import { submitOnce } from "./submit.js";

const SHARED_ACKS = [
  ["acknowledge_no_completed_effect_replay", "No completed effect runs again: completed steps keep their receipts."],
  ["acknowledge_same_request_attempt_and_budgets", "The same request, attempt and budgets continue; nothing is reset."],
  ["acknowledge_finite_ownership_lease", "The window is a finite ownership lease; it ends."],
];

const FLOWS = {
  checkpoint: {
    title: "Saved continuation",
    route: "checkpoint-continuations",
    check: "Check current admission",
    review: "Review saved continuation",
    submit: "Continue saved task",
    read: "Check saved continuation",
    saved: "Saved continuation",
    confirmed: "Saved continuation confirmed",
    window: "Time window (seconds)",
    firstAck: ["acknowledge_retained_response_consumed_once", "The retained response is consumed at most once."],
    retained: (c) => c.checkpoint ? JSON.stringify(c.checkpoint) : "—",
  },
  final: {
    title: "Saved agent result",
    route: "final-outcome-continuations",
    check: "Check saved result",
    review: "Review saved result",
    submit: "Accept saved result",
    read: "Read saved action",
    saved: "Saved result accepted",
    confirmed: "Saved result accepted",
    window: "Claim window (seconds)",
    firstAck: ["acknowledge_already_consumed_final_output", "The final output was already consumed: it is accepted, never requested again."],
    retained: (c) => c.retained_outcome
      ? `${c.retained_outcome.outcome}${c.retained_outcome.followup_kind ? `, next step: ${c.retained_outcome.followup_kind}` : ""}`
      : "—",
  },
};

export function planTab(runId) {
  const root = h("div", {}, h("p", {}, "Loading…"));
  api("GET", `/api/v1/runs/${runId}`).then((run) => {
    root.replaceChildren(
      h("p", { class: "muted" }, "Candidate checks start no work. An admitted action queues the existing ticket; later worker receipts say what ran."),
      flow(FLOWS.checkpoint, "checkpoint", run),
      flow(FLOWS.final, "final", run),
      publication(run),
      records(run.run_id));
  }).catch((e) => root.replaceChildren(h("p", { class: "notice error", role: "status" }, e.status === 404 ? "No such run." : errorText(e))));
  return root;
}

function flow(spec, kind, run) {
  const base = `/api/v1/runs/${run.run_id}/${spec.route}/requests/${run.request_id}`;
  const key = `${kind}.${run.run_id}.${run.request_id}`;
  const id = `flow-${kind}`;
  const status = notice();
  const stage = h("div", { class: "stage" });
  const readback = h("div", { class: "readback" });
  const section = h("section", { class: "card flow", id, "aria-labelledby": `${id}-title` },
    h("h2", { id: `${id}-title` }, spec.title), stage, readback, status);

  function readButton() {
    return h("button", { type: "button", class: "read" }, spec.read);
  }
  stage.addEventListener("click", (event) => {
    if (event.target.closest("button.read")) readBack();
  });

  async function readBack() {
    const saved = savedDecision(key);
    try {
      const now = await api("GET", `${base}/status`);
      const rows = [["Status", stateBadge(now.status)], ["Action", now.action_id || "—"]];
      if (now.lease) rows.push(["Window", `${now.lease.valid_for_seconds} s, ends ${when(now.lease.window_ends_at)} (${now.lease.admission_window_purpose})`]);
      const shown = h("div", {}, h("h3", {}, "Saved action"), facts(rows));
      if (!saved) {
        say(status, now.action_id ? `Action ${now.action_id} is recorded: ${now.status}.` : "No saved action is recorded for this request.");
      } else if (now.action_id === saved.action_id) {
        markDecision(key, { outcome: "confirmed", status: now.status });
        render(true);
        const bad = ["failed", "needs_reconciliation"].includes(now.status);
        say(status, `${spec.confirmed}: action ${saved.action_id} is ${now.status.replaceAll("_", " ")}.${now.status === "queued" ? " A worker has not claimed it yet." : ""}${bad ? " Read the journal for what ran." : ""}`, bad ? "warn" : "ok");
      } else if (now.action_id) {
        say(status, `The latest action recorded for this request is ${now.action_id}, not the saved ${saved.action_id}: whether the saved one was admitted is unresolved here. Keep it, and read the journal for what ran.`, "warn");
      } else {
        say(status, `No action is recorded yet for the saved action ${saved.action_id}. Its outcome is unresolved: keep it, and check again.`, "warn");
      }
      readback.replaceChildren(shown);
    } catch (e) {
      say(status, `Could not read the saved action: ${errorText(e)}. The saved decision is kept.`, "error");
    }
  }

  function savedPanel(saved) {
    const confirmed = saved.outcome === "confirmed";
    return [
      h("p", {}, confirmed
        ? `The saved action ${saved.action_id} is recorded (${saved.status}).`
        : `A decision is saved in this browser: action ${saved.action_id}. It is never sent twice; read it back to learn its outcome.`),
      facts([["Action", h("span", { class: "mono" }, saved.action_id)], ["Saved", when(saved.saved_at)],
        ["Window", `${JSON.parse(saved.text).valid_for_seconds} s`]]),
      confirmed && can("admin") ? h("button", { type: "button", onclick: () => { forgetDecision(key); render(); } }, "Start a new review") : null,
    ];
  }

  function review(candidate) {
    const max = candidate.maximum_window_seconds;
    const windowInput = h("input", { id: `${id}-window`, type: "number", min: 1, max, step: 1, required: true, value: Math.min(600, max) });
    const acks = [spec.firstAck, ...SHARED_ACKS].map(([field, text]) => {
      const box = h("input", { type: "checkbox", id: `${id}-${field}`, name: field });
      return { field, box, row: h("div", { class: "check" }, box, h("label", { for: `${id}-${field}` }, text)) };
    });
    const submit = h("button", { type: "submit", class: "primary", disabled: true }, spec.submit);
    let sending = false;
    const update = () => {
      const value = Number(windowInput.value);
      submit.disabled = sending || !(acks.every((a) => a.box.checked) && Number.isInteger(value) && value >= 1 && value <= max);
    };
    for (const a of acks) a.box.addEventListener("change", update);
    windowInput.addEventListener("input", update);
    const form = h("form", { class: "review", onsubmit: async (event) => {
      event.preventDefault();
      update();
      if (submit.disabled) return;
      // Nothing on the form changes, and nothing is sent again, while this one is out.
      sending = true;
      submit.disabled = true;
      for (const input of [windowInput, ...acks.map((a) => a.box)]) input.disabled = true;
      const body = { version: 1, candidate_digest: candidate.candidate_digest, valid_for_seconds: Number(windowInput.value) };
      for (const a of acks) body[a.field] = true;
      const actionId = newId();
      const outcome = await submitOnce(key, { action_id: actionId, path: `${base}/actions/${actionId}`, text: JSON.stringify(body) }, status, spec);
      if (outcome === "not_sent") {
        sending = false;
        for (const input of [windowInput, ...acks.map((a) => a.box)]) input.disabled = false;
        update();
      }
      else if (outcome === "refused") render(true);
      else render(true);
    } },
    h("h3", {}, spec.review),
    facts([
      ["Retained work", spec.retained(candidate)],
      ["Attempt", `${candidate.attempt} of ${candidate.max_attempts}`],
      ["Charged usage", `${candidate.charged_usage.commands} commands, ${seconds(candidate.charged_usage.wall_ms)} wall, ${seconds(candidate.charged_usage.cpu_ms)} CPU`],
      ["Limits", `${candidate.limits.max_commands} commands, ${candidate.limits.max_wall_seconds} s${candidate.limits.deadline ? `, deadline ${when(candidate.limits.deadline)}` : ""}`],
      ["Policy allows", `a window of up to ${max} s (policy revision ${candidate.policy_revision})`],
    ]),
    h("label", { for: `${id}-window` }, `${spec.window}, 1 to ${max}`), windowInput,
    h("fieldset", {}, h("legend", {}, "Acknowledgements (all four)"), acks.map((a) => a.row)),
    submit);
    return form;
  }

  async function check(button) {
    button.disabled = true;
    try {
      const candidate = await api("GET", `${base}/candidate`);
      const ready = candidate.admission === "READY";
      const parts = [
        facts([["Admission", h("strong", {}, candidate.admission)], ["Request state", candidate.request_state.replaceAll("_", " ")]]),
        candidate.holds.length
          ? h("ul", { class: "holds", "aria-label": "Holds" }, candidate.holds.map((x) => h("li", {}, `${x.reason}: ${x.message}`)))
          : null,
      ];
      parts.push(readButton());
      if (ready && can("admin")) {
        const go = h("button", { type: "button", class: "primary", onclick: () => {
          go.remove();
          const form = review(candidate);
          stage.append(form);
          form.querySelector("input").focus();
        } }, spec.review);
        parts.push(go);
      } else if (ready) {
        parts.push(h("p", { class: "muted" }, "Admitting a continuation needs the admin role."));
      }
      stage.replaceChildren(...parts.filter(Boolean));
      say(status, ready ? "The current checks pass." : "Held: the request cannot proceed.", ready ? "ok" : "warn");
    } catch (e) {
      button.disabled = false;
      say(status, errorText(e), "error");
    }
  }

  function render(keepStatus = false) {
    const saved = savedDecision(key);
    if (!keepStatus) say(status, "");
    readback.replaceChildren();
    if (saved) {
      const [text, list, newReview] = savedPanel(saved);
      stage.replaceChildren(text, list, h("div", { class: "actions" }, newReview, readButton()));
    } else {
      const checkButton = h("button", { type: "button", onclick: () => check(checkButton) }, spec.check);
      stage.replaceChildren(h("div", { class: "actions" }, checkButton, readButton()));
    }
  }
  render();
  return section;
}
