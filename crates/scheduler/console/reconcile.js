// A run that needs a person: each uncertain step, what is known of it, and the three
// decisions an operator may take on it. A decision's id and body are kept in the browser
// before its one POST; after a lost answer the page reads that decision back instead of
// deciding again.

import { api, can, errorText, facts, forgetDecision, h, newId, saveDecision, savedDecision, say, when } from "./core.js";

const VERDICTS = [
  ["mark_done", "Mark done", "The effect happened: record a receipt by a person; the run goes on after this step."],
  ["mark_not_done", "Mark not done", "The effect did not happen: this step runs again, once, on the same request."],
  ["fail_run", "Fail run", "The run fails here."],
];

/** The decision panel of a run in `needs_reconciliation` (null otherwise). */
export function reconciliation(run, view, status, reload) {
  if (run.state !== "needs_reconciliation" || !view) return null;
  const steps = view.uncertain_steps || [];
  return h("section", { class: "card", "aria-labelledby": "reconcile-title" },
    h("h2", { id: "reconcile-title" }, "Needs a person"),
    steps.length === 0
      ? h("p", {}, `No step waits for a decision (${run.stop_reason || "see the stop reason"}): cancel the run, or continue it from the Plan tab.`)
      : steps.map((step) => stepPanel(run, step, status, reload)));
}

function stepPanel(run, step, status, reload) {
  const key = `reconcile.${run.run_id}.${step.step_key}`;
  const reason = h("input", { type: "text", "aria-label": `Why, for step ${step.step_key}`, maxlength: "2000",
    placeholder: "Why (kept in the journal with your token's name)" });
  const decide = async (verdict, button) => {
    const saved = savedDecision(key);
    const body = saved ? saved.body : { step_key: step.step_key, decision: verdict, reason: reason.value.trim() };
    if (!saved && !body.reason) {
      say(status, "Say why first: the journal keeps the reason.", "error");
      return;
    }
    const id = saved ? saved.id : newId();
    try {
      saveDecision(key, { id, body });
    } catch (e) {
      say(status, `Not sent: the decision could not be kept first (${errorText(e)}).`, "error");
      return;
    }
    button.disabled = true;
    say(status, `${step.step_key}: deciding…`);
    try {
      const done = await api("POST", `/api/v1/runs/${run.run_id}/reconciliation/decisions/${id}`, body);
      forgetDecision(key);
      say(status, `${step.step_key}: ${done.decision.replaceAll("_", " ")} by ${done.decided_by_name}; the run ${done.outcome === "queued" ? "continues" : done.outcome}.`, "ok");
    } catch (e) {
      // A refusal decided nothing, so the kept one goes; an unknown outcome keeps it.
      if (e.status >= 400 && e.status < 500) forgetDecision(key);
      say(status, `${step.step_key}: ${errorText(e)}`, "error");
    }
    reload();
  };
  const waiting = savedDecision(key);
  return h("article", { class: "output", "aria-label": `Decision on ${step.step_key}` },
    h("h3", {}, `Step ${step.step_key}`),
    facts([
      ["Standing", step.standing.replaceAll("_", " ")],
      ["Started", `${when(step.started_at)} at epoch ${step.intent_epoch}${step.worker ? ` on ${step.worker}` : ""}`],
      ["Its end", step.ended_at ? `not recorded; charged up to ${when(step.ended_at)}` : "not recorded"],
      ["May run again", step.idempotent ? "yes (idempotent)" : "no: not idempotent"],
    ]),
    h("p", { class: "muted" }, "Its output so far is under Output, below."),
    can("operator")
      ? h("div", { class: "actions", role: "group", "aria-label": `Decide ${step.step_key}` },
        waiting ? h("p", { class: "muted" }, `A decision was kept here (${waiting.body.decision.replaceAll("_", " ")}): deciding again sends that same one.`) : reason,
        VERDICTS.map(([verdict, label, title]) => h("button", { type: "button", title, class: verdict === "fail_run" ? "danger" : "",
          onclick: (e) => decide(verdict, e.currentTarget) }, label)))
      : h("p", { class: "muted" }, "An operator decides this step."));
}

/** The reconciliation of a run, when it needs a person. */
export function loadReconciliation(run) {
  if (run.state !== "needs_reconciliation") return Promise.resolve(null);
  return api("GET", `/api/v1/runs/${run.run_id}/reconciliation`);
}
