// Connections → Saved-work recovery (admins): the policy screen. A save sends only the
// settings the admin changed on the form, so every other setting keeps its saved value,
// whoever changed it meanwhile.

import { api, can, errorText, facts, h, notice, say, when } from "./core.js";

export function connectionsPage() {
  const root = h("section", { class: "page" }, h("h1", {}, "Connections"));
  if (!can("admin")) {
    root.append(h("p", { class: "notice warn" }, "The saved-work recovery policy is for admins."));
    return root;
  }
  const status = notice();
  const summary = h("div", {});
  const editor = h("div", {});
  const section = h("section", { class: "card", "aria-labelledby": "recovery-title" },
    h("h2", { id: "recovery-title" }, "Saved-work recovery"), summary, editor, status);
  root.append(section);

  const load = async () => {
    try {
      const policy = await api("GET", "/api/v1/invalid-read-continuity/policy");
      summary.replaceChildren(facts([
        ["Saved-work recovery", policy.enabled ? "enabled" : "disabled"],
        ["Reviewed checkpoint continuations", policy.allow_checkpoint_continuation ? "allowed" : "not allowed"],
        ["Reviewed final-result continuations", policy.allow_final_outcome_continuation ? "allowed" : "not allowed"],
        ["Maximum time window", `${policy.maximum_window_seconds} s`],
        ["Revision", `${policy.revision}, saved ${when(policy.updated_at)}`],
      ]),
      h("div", { class: "actions" },
        h("button", { type: "button", onclick: () => open("checkpoint") }, "Review continuation settings"),
        h("button", { type: "button", onclick: () => open("final") }, "Review final-result settings")));
    } catch (e) {
      say(status, errorText(e), "error");
    }
  };

  // The form starts from the policy as saved now, not as this page first read it.
  async function open(part) {
    try {
      const policy = await api("GET", "/api/v1/invalid-read-continuity/policy");
      say(status, "");
      edit(part, policy);
    } catch (e) {
      say(status, errorText(e), "error");
    }
  }

  function edit(part, policy) {
    const enabled = h("input", { type: "checkbox", id: "policy-enabled", checked: policy.enabled });
    const allow = part === "checkpoint"
      ? h("input", { type: "checkbox", id: "policy-allow", checked: policy.allow_checkpoint_continuation })
      : h("input", { type: "checkbox", id: "policy-allow", checked: policy.allow_final_outcome_continuation });
    const windowInput = h("input", { type: "number", id: "policy-window", min: 1, max: 7200, step: 1, required: true, value: policy.maximum_window_seconds });
    const form = h("form", { class: "review", onsubmit: async (event) => {
      event.preventDefault();
      const change = {};
      if (enabled.checked !== policy.enabled) change.enabled = enabled.checked;
      if (part === "checkpoint") {
        if (allow.checked !== policy.allow_checkpoint_continuation) change.allow_checkpoint_continuation = allow.checked;
        if (Number(windowInput.value) !== policy.maximum_window_seconds) change.maximum_window_seconds = Number(windowInput.value);
      } else if (allow.checked !== policy.allow_final_outcome_continuation) {
        change.allow_final_outcome_continuation = allow.checked;
      }
      if (Object.keys(change).length === 0) {
        say(status, `Nothing to save: nothing on the form differs from revision ${policy.revision}, which it was opened with.`, "info");
        return;
      }
      try {
        const saved = await api("PUT", "/api/v1/invalid-read-continuity/policy", change);
        editor.replaceChildren();
        say(status, `Saved: revision ${saved.revision}. Other recovery settings kept their saved values.`, "ok");
        load();
      } catch (e) {
        say(status, errorText(e), "error");
      }
    } },
    h("h3", {}, part === "checkpoint" ? "Continuation settings" : "Final-result settings"),
    h("p", { class: "muted" }, "Only the settings you change here are saved. Each task still needs its own review."),
    h("div", { class: "check" }, enabled, h("label", { for: "policy-enabled" }, "Enable saved-work recovery")),
    h("div", { class: "check" }, allow, h("label", { for: "policy-allow" },
      part === "checkpoint" ? "Allow reviewed checkpoint continuations" : "Allow reviewed final-result continuations")),
    part === "checkpoint" ? [h("label", { for: "policy-window" }, "Maximum time window (seconds, 1 to 7200)"), windowInput] : null,
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Save settings"),
      h("button", { type: "button", onclick: () => editor.replaceChildren() }, "Close")));
    editor.replaceChildren(form);
    enabled.focus();
  }
  load();
  return root;
}
