// Submitting a reviewed decision once. The action id and the exact body are saved in
// browser storage before the POST; if storage fails, nothing is sent. A lost response
// leaves the saved decision in place, to be read back; the page never sends it again.

import { api, ApiError, errorText, saveDecision, savedDecision, forgetDecision, markDecision, say } from "./core.js";

/**
 * Saves `decision` ({action_id, path, text}) under `key`, then POSTs `text` to `path`
 * once. Returns "saved", "refused", "lost" or "not_sent", having said why in `status`.
 */
export async function submitOnce(key, decision, status, labels) {
  // Another tab, or an earlier click, may have saved one: that one stands.
  const earlier = savedDecision(key);
  if (earlier) {
    say(status, `Not sent: a decision is already saved for this request (action ${earlier.action_id}). Use ${labels.read} instead.`, "warn");
    return "not_sent";
  }
  try {
    saveDecision(key, { ...decision, saved_at: new Date().toISOString() });
  } catch (e) {
    say(status, `Not sent: this browser could not keep the decision before submitting (${e.message}). Nothing was submitted; allow site storage and review again.`, "error");
    return "not_sent";
  }
  try {
    const receipt = await api("POST", decision.path, decision.text);
    markDecision(key, { outcome: "saved", receipt });
    say(status, `${labels.saved}: action ${decision.action_id}.`, "ok");
    return "saved";
  } catch (e) {
    const definite = e instanceof ApiError && e.status >= 400 && e.status < 500 && e.status !== 408;
    if (definite) {
      // The API refused it: nothing was admitted under this id, so a new review may follow.
      if (savedDecision(key)?.action_id === decision.action_id) forgetDecision(key);
      say(status, `Refused, nothing was admitted: ${errorText(e)}`, "error");
      return "refused";
    }
    markDecision(key, { outcome: "uncertain" });
    say(status, `The response was lost (${errorText(e)}). The decision is saved in this browser and will not be sent again: use ${labels.read} to see whether it was recorded.`, "warn");
    return "lost";
  }
}
