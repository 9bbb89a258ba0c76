// The Plan tab's Publication: the run's delivery hold (set and released by an admin),
// and publishing a completed run once: the request id and exact body saved in browser
// storage before the one POST, then read back to its delivery receipt.

import { api, can, errorText, facts, h, newId, notice, savedDecision, say, stateBadge } from "./core.js";
import { submitOnce } from "./submit.js";

const LABELS = { saved: "Publication requested", read: "Read publication" };

export function publication(run) {
  const status = notice();
  const stage = h("div", {});
  const root = h("section", { class: "card flow", id: "flow-publication", "aria-labelledby": "publication-title" },
    h("h2", { id: "publication-title" }, "Publication"), stage, status);
  const key = `publication.${run.run_id}`;
  const base = `/api/v1/runs/${run.run_id}`;

  async function render() {
    let hold;
    try {
      hold = await api("GET", `${base}/delivery-hold`);
    } catch (e) {
      stage.replaceChildren(h("p", { class: "notice error" }, errorText(e)));
      return;
    }
    const parts = [facts([["Run", stateBadge(run.state)], ["Delivery hold", hold.held ? `held: ${hold.reason}` : "none"]])];
    if (can("admin")) parts.push(holdControls(hold));
    const saved = savedDecision(key);
    if (saved) {
      parts.push(h("p", {}, `A publication is saved in this browser: ${saved.action_id}. It is never sent twice.`),
        h("div", { class: "actions" }, h("button", { type: "button", onclick: readBack }, LABELS.read)));
    } else if (can("admin")) {
      parts.push(publishForm());
    } else {
      parts.push(h("p", { class: "muted" }, "Publishing needs the admin role (release access)."));
    }
    stage.replaceChildren(...parts);
  }

  function holdControls(hold) {
    if (hold.held) {
      return h("div", { class: "actions" }, h("button", { type: "button", onclick: () => change("DELETE") }, "Release delivery hold"));
    }
    const reason = h("input", { id: "delivery-hold-reason", type: "text", maxlength: 500 });
    return h("div", { class: "check" }, h("label", { for: "delivery-hold-reason" }, "Hold reason"), reason,
      h("button", { type: "button", onclick: () => change("PUT", reason.value) }, "Set delivery hold"));
  }

  async function change(method, reason) {
    try {
      await api(method, `${base}/delivery-hold`, method === "PUT" ? JSON.stringify({ reason }) : undefined);
      say(status, method === "PUT" ? "Delivery hold set." : "Delivery hold released.", "ok");
    } catch (e) {
      say(status, errorText(e), "error");
    }
    render();
  }

  function publishForm() {
    const ack = h("input", { type: "checkbox", id: "publication-ack" });
    const publish = h("button", { type: "submit", class: "primary", disabled: true }, "Publish result");
    ack.addEventListener("change", () => { publish.disabled = !ack.checked; });
    return h("form", { class: "review", onsubmit: async (event) => {
      event.preventDefault();
      if (!ack.checked) return;
      publish.disabled = true;
      const requestId = newId();
      const body = { version: 1, request_id: requestId, acknowledge_command_receipts_read: true };
      const outcome = await submitOnce(key, { action_id: requestId, path: `${base}/publications`, text: JSON.stringify(body) }, status, LABELS);
      if (outcome === "not_sent") publish.disabled = false;
      else if (outcome !== "refused") render();
    } },
    h("div", { class: "check" }, ack, h("label", { for: "publication-ack" }, "I read the run's command receipts (Records, and the journal) before publishing.")),
    publish);
  }

  async function readBack() {
    const saved = savedDecision(key);
    if (!saved) return;
    try {
      const p = await api("GET", `${base}/publications/${saved.action_id}`);
      const d = p.delivery;
      say(status, d
        ? `Publication ${p.state}: ${d.files_changed} ${d.files_changed === 1 ? "file" : "files"} changed, ${d.artifact_key}, SHA-256 ${d.sha256}.`
        : `Publication ${p.state.replaceAll("_", " ")}${p.stop_reason ? `: ${p.stop_reason}` : ""}.`, d ? "ok" : "info");
    } catch (e) {
      say(status, e.status === 404 ? `No publication is recorded under ${saved.action_id} yet. Keep it; it is not sent again.`
        : `Could not read the publication: ${errorText(e)}`, "warn");
    }
  }

  render();
  return root;
}
