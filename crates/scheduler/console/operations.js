// Operations: workers and the leases they hold, the reaper's last sweeps and pending
// repairs, sandboxes with their actions, and tokens (admins).

import { api, can, errorText, every, h, notice, rerender, say, stateBadge, table, when } from "./core.js";
import { rawJson } from "./records.js";

const REFRESH_MS = 3000;

/** Bytes as people read them: B, KiB, MiB, GiB, TiB. */
function bytes(n) {
  if (typeof n !== "number" || !Number.isFinite(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

function took(started, finished) {
  const ms = Date.parse(finished) - Date.parse(started);
  if (!Number.isFinite(ms) || ms < 0) return "—";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

// A count of the sweep's summary; "—" when an older reaper did not report it.
const count = (v) => (typeof v === "number" ? String(v) : "—");
// A count and, when any, what did not go: "4, 1 failed".
const withFailed = (done, failed, word = "failed") => `${count(done)}${failed > 0 ? `, ${failed} ${word}` : ""}`;

// One column per rule of a sweep (the reaper's SweepReport), in the order it runs them.
const SWEEP_COLUMNS = [
  ["Stale captures failed", (m) => count(m.stale_captures_failed)],
  ["Retired (credentials rotated)", (m) => count(m.credential_retired)],
  ["Idle heads retired", (m) => count(m.idle_heads_retired)],
  ["Retired (sandbox rules)", (m) => count(m.sandbox_retired)],
  ["Holds ended", (m) => count(m.holds_ended)],
  ["Snapshots reclaimed", (m) => withFailed(m.snapshots_reclaimed, m.reclaim_deferred, "deferred")],
  ["Sent to repair", (m) => count(m.reclaim_failed)],
  ["Bytes freed", (m) => bytes(m.bytes_reclaimed)],
  ["Outputs reclaimed", (m) => withFailed(m.outputs_reclaimed, m.outputs_failed)],
  ["Snapshots verified", (m) => withFailed(m.snapshots_verified, m.verify_failed)],
];

export function operationsPage() {
  const status = notice();
  const workersBody = h("div", {});
  const reaperBody = h("div", {});
  const sandboxesBody = h("div", {});
  const workers = h("section", { "aria-labelledby": "workers-title" }, h("h2", { id: "workers-title" }, "Workers"), workersBody);
  const reaper = h("section", { "aria-labelledby": "reaper-title" }, h("h2", { id: "reaper-title" }, "Reaper"), reaperBody);
  const sandboxes = h("section", { "aria-labelledby": "sandboxes-title" }, h("h2", { id: "sandboxes-title" }, "Sandboxes"), sandboxesBody);
  const tokens = can("admin") ? h("section", { "aria-labelledby": "tokens-title" }, h("h2", { id: "tokens-title" }, "Tokens")) : null;
  const refreshed = h("span", { class: "refreshed" }, "Loading…");
  const root = h("section", { class: "page" },
    h("div", { class: "heading" }, h("h1", {}, "Operations"), h("div", { class: "live" }, refreshed)),
    status, workers, reaper, sandboxes, tokens);

  const sandboxAction = async (id, verb, method = "POST") => {
    try {
      await api(method, verb ? `/api/v1/sandboxes/${id}/${verb}` : `/api/v1/sandboxes/${id}`, method === "POST" ? "{}" : undefined);
      say(status, `Sandbox ${id}: ${verb || "destroy"} asked.`, "ok");
    } catch (e) {
      say(status, `Sandbox ${id}: ${errorText(e)}`, "error");
    }
  };

  let failing = false;
  async function refresh() {
    try {
      const [w, r, s] = await Promise.all([api("GET", "/api/v1/workers"), api("GET", "/api/v1/reaper").catch((e) => {
        // A tenant's token does not see the reaper, whose sweeps span every tenant.
        if (e.status === 403) return null;
        throw e;
      }), api("GET", "/api/v1/sandboxes?limit=100")]);
      rerender(workersBody, w, () => table("Workers that beat in the last hour", ["Worker", "Alive", "Beating since", "Waiting for work since", "Leases held"],
        w.workers.map((x) => [x.worker_id, x.alive ? "alive" : `silent since ${when(x.beat_at)}`, when(x.beating_since),
          x.starved_since ? when(x.starved_since) : "—",
          x.leases.length ? h("ul", { class: "plain" }, x.leases.map((l) => h("li", {},
            h("a", { href: `#/runs/${l.run_id}`, class: "mono" }, l.run_id), ` epoch ${l.lease_epoch}, until ${when(l.lease_deadline)}`))) : "none"]),
        "No worker has beaten in the last hour: start cairn-worker."));
      if (!r) rerender(reaperBody, {}, () => [h("p", {}, "The reaper's sweeps span every tenant: a platform token shows them.")]);
      else rerender(reaperBody, r, () => [
        table("Last sweeps, newest first", ["Started", "Took", "Dry run", ...SWEEP_COLUMNS.map(([heading]) => heading), "Leader", "Raw"],
          r.sweeps.map((x) => {
            const m = x.summary || {};
            return [when(x.started_at), took(x.started_at, x.finished_at), x.dry_run ? "yes" : "no",
              ...SWEEP_COLUMNS.map(([, cell]) => cell(m)), typeof m.leader === "string" ? m.leader : "—",
              rawJson(x, `Sweep started ${when(x.started_at)}`)];
          }),
          "The reaper has not swept yet."),
        h("h3", {}, "Pending operator repairs"),
        table("Snapshots whose deletion waits for repair", ["Snapshot", "Kind", "Store", "Reason", "Attempts", "Next retry"],
          r.pending_repairs.map((x) => [h("span", { class: "mono" }, x.snapshot_id), x.kind, x.store_url, x.reason || "—", String(x.attempts), when(x.next_retry_at)]),
          "Nothing waits for repair.")]);
      rerender(sandboxesBody, s, () => table("Sandboxes, newest first", ["Sandbox", "Agent", "State", "Pending", "Timeout", can("operator") ? "Actions" : "Stop reason"],
        s.sandboxes.map((x) => [h("span", { class: "mono" }, x.sandbox_id), x.agent, stateBadge(x.state), x.pending || "—", `${x.timeout_sec} s`,
          can("operator") ? h("div", { class: "actions" },
            h("button", { type: "button", disabled: x.state !== "running", "aria-label": `Pause sandbox ${x.sandbox_id}`, onclick: () => sandboxAction(x.sandbox_id, "pause") }, "Pause"),
            h("button", { type: "button", disabled: !["paused", "stopped"].includes(x.state), "aria-label": `Resume sandbox ${x.sandbox_id}`, onclick: () => sandboxAction(x.sandbox_id, "resume") }, "Resume"),
            h("button", { type: "button", disabled: !["running", "paused"].includes(x.state), "aria-label": `Stop sandbox ${x.sandbox_id}`, onclick: () => sandboxAction(x.sandbox_id, "stop") }, "Stop"),
            h("button", { type: "button", class: "danger", disabled: x.state === "destroyed", "aria-label": `Destroy sandbox ${x.sandbox_id}`,
              onclick: () => confirm(`Destroy sandbox ${x.sandbox_id}?`) && sandboxAction(x.sandbox_id, null, "DELETE") }, "Destroy"))
            : x.stop_reason || "—"]),
        "No sandboxes."));
      refreshed.textContent = `Updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
      if (failing) {
        failing = false;
        say(status, "");
      }
    } catch (e) {
      failing = true;
      say(status, `Could not refresh: ${errorText(e)}`, "error");
    }
  }
  every(REFRESH_MS, root, refresh);
  if (tokens) loadTokens(tokens);
  return root;
}

async function loadTokens(section) {
  const status = notice();
  const name = h("input", { id: "token-name", name: "name", required: true, maxlength: 128 });
  const role = h("select", { id: "token-role", name: "role" }, ["viewer", "operator", "admin"].map((r) => h("option", { value: r }, r)));
  const secret = h("div", { "aria-live": "polite" });
  const list = h("div", {});
  const reload = async () => {
    try {
      const t = await api("GET", "/api/v1/tokens");
      list.replaceChildren(table("Tokens, newest first", ["Name", "Role", "Created", "Revoked", "Action"],
        t.tokens.map((x) => [x.name, x.role, when(x.created_at), x.revoked_at ? when(x.revoked_at) : "—",
          x.revoked_at ? "" : h("button", { type: "button", class: "danger", "aria-label": `Revoke ${x.name} (${x.role}, token ${x.token_id})`, onclick: async () => {
            if (!confirm(`Revoke the token ${x.name}? Anyone using it is refused from now on.`)) return;
            try {
              await api("POST", `/api/v1/tokens/${x.token_id}/revoke`);
              say(status, `Revoked ${x.name}.`, "ok");
            } catch (e) {
              say(status, errorText(e), "error");
            }
            reload();
          } }, `Revoke ${x.name}`)])));
    } catch (e) {
      say(status, errorText(e), "error");
    }
  };
  const create = h("button", { type: "submit" }, "Create token");
  const form = h("form", { class: "filters", onsubmit: async (event) => {
    event.preventDefault();
    if (create.disabled) return;
    create.disabled = true;
    // Each attempt says only its own outcome.
    say(status, "");
    secret.replaceChildren();
    try {
      const created = await api("POST", "/api/v1/tokens", { name: name.value.trim(), role: role.value });
      secret.replaceChildren(h("p", { class: "notice ok" }, `Token ${created.name} (${created.role}) created. Copy it now; it is not shown again:`),
        h("pre", { class: "secret", tabindex: "0", "aria-label": "New token" }, created.token));
      name.value = "";
      reload();
    } catch (e) {
      say(status, errorText(e), "error");
    } finally {
      create.disabled = false;
    }
  } }, h("label", { for: "token-name" }, "Name"), name, h("label", { for: "token-role" }, "Role"), role, create);
  section.append(form, secret, status, list);
  reload();
}
