// Sandboxes: the list (filtered by state and agent in the address), and one sandbox:
// its facts, services and ports, an exec whose output shows as it is printed, its
// journal of operations, its snapshots, and the lifecycle actions.

import { api, can, errorText, every, facts, h, notice, rerender, say, stateBadge, stream, table, tailView, when } from "./core.js";

const STATES = ["creating", "running", "paused", "stopped", "error", "destroyed"];
const REFRESH_MS = 2000;
// How often an exec whose output ended is read until its receipt shows.
const RECEIPT_MS = 400;

export function sandboxesPage(params) {
  const state = STATES.includes(params.get("state")) ? params.get("state") : "";
  const agent = params.get("agent") || "";
  const status = notice();
  const list = h("div", { id: "sandbox-list" });
  const refreshed = h("span", { class: "refreshed", "aria-live": "off" }, "Loading…");
  const stateSelect = h("select", { id: "sandbox-state", name: "state" },
    h("option", { value: "" }, "Any state"),
    STATES.map((s) => h("option", { value: s, selected: s === state }, s)));
  const agentInput = h("input", { id: "sandbox-agent", name: "agent", value: agent, placeholder: "any agent",
    pattern: "[A-Za-z0-9._\\-]{1,128}" });
  const filters = h("form", { class: "filters", role: "search", onsubmit: (event) => {
    event.preventDefault();
    const q = new URLSearchParams();
    if (stateSelect.value) q.set("state", stateSelect.value);
    if (agentInput.value.trim()) q.set("agent", agentInput.value.trim());
    location.hash = q.toString() ? `#/sandboxes?${q}` : "#/sandboxes";
  } },
  h("label", { for: "sandbox-state" }, "State"), stateSelect,
  h("label", { for: "sandbox-agent" }, "Agent"), agentInput,
  h("button", { type: "submit" }, "Filter"),
  (state || agent) ? h("a", { href: "#/sandboxes" }, "Clear filters") : null);
  const root = h("section", { class: "page" },
    h("div", { class: "heading" }, h("h1", {}, "Sandboxes"), h("div", { class: "live" }, refreshed)),
    filters, status, list);

  async function refresh() {
    const query = new URLSearchParams({ limit: "100" });
    if (state) query.set("state", state);
    if (agent) query.set("agent", agent);
    try {
      const page = await api("GET", `/api/v1/sandboxes?${query}`);
      rerender(list, page, () => table("Sandboxes, newest first", ["Sandbox", "Agent", "State", "Ports", "Services", "Last activity"],
        page.sandboxes.map((x) => [h("a", { href: `#/sandboxes/${x.sandbox_id}`, class: "mono" }, x.sandbox_id), x.agent,
          stateBadge(x.state), x.ports.length ? x.ports.join(", ") : "—",
          Object.keys(x.services).length ? Object.keys(x.services).join(", ") : "—", when(x.last_activity_at)]),
        "No sandboxes match.", { stack: true }));
      refreshed.textContent = `Updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
      say(status, "");
    } catch (e) {
      say(status, `Could not refresh: ${errorText(e)}`, "error");
    }
  }
  every(REFRESH_MS, root, refresh);
  return root;
}

export function sandboxPage(id) {
  const status = notice();
  const summary = h("div", {});
  const journal = h("div", {});
  const snapshots = h("div", {});
  const exec = can("operator") ? execForm(id) : null;
  const actions = can("operator") ? h("div", { class: "actions", role: "group", "aria-label": "Lifecycle" }) : null;
  const root = h("section", { class: "page" },
    h("div", { class: "heading" }, h("h1", {}, "Sandbox ", h("span", { class: "mono" }, id))),
    h("p", {}, h("a", { href: "#/sandboxes" }, "All sandboxes")),
    status, actions, summary, exec,
    h("section", { "aria-labelledby": "journal-title" }, h("h2", { id: "journal-title" }, "Operations"), journal),
    h("section", { "aria-labelledby": "snapshots-title" }, h("h2", { id: "snapshots-title" }, "Snapshots"), snapshots));

  const act = async (verb, method = "POST") => {
    try {
      await api(method, verb ? `/api/v1/sandboxes/${id}/${verb}` : `/api/v1/sandboxes/${id}`, method === "POST" ? "{}" : undefined);
      say(status, `${verb || "destroy"} asked.`, "ok");
    } catch (e) {
      say(status, errorText(e), "error");
    }
  };

  async function refresh() {
    try {
      const [s, ops, snaps] = await Promise.all([api("GET", `/api/v1/sandboxes/${id}`),
        api("GET", `/api/v1/sandboxes/${id}/operations`), api("GET", `/api/v1/snapshots?sandbox_id=${id}`)]);
      rerender(summary, s, () => [facts([
        ["State", stateBadge(s.state)], ["Pending", s.pending || "—"], ["Agent", s.agent],
        ["Persistent", s.persistent ? "yes" : "no"], ["Durability", s.durability.replaceAll("_", " ")],
        ["Disk", `${s.disk_mb} MiB`], ["Timeout", `${s.timeout_sec} s (idle ${s.idle_timeout_sec} s)`],
        ["Source", s.source || "—"], ["Stop reason", s.stop_reason || "—"], ["Error", s.error_reason || "—"],
        ["Ports", s.ports.length ? s.ports.join(", ") : "none"], ["Last activity", when(s.last_activity_at)]]),
      table("Services, started on every start and resume", ["Name", "Command", "Directory"],
        Object.entries(s.services).map(([name, x]) => [name, h("code", {}, x.argv.join(" ")), x.cwd || "/workspace"]),
        "No services.")]);
      if (actions) {
        rerender(actions, [s.state, s.pending], () => [
          h("button", { type: "button", disabled: s.state !== "running", onclick: () => act("pause") }, "Pause"),
          h("button", { type: "button", disabled: !["paused", "stopped"].includes(s.state), onclick: () => act("resume") }, "Resume"),
          h("button", { type: "button", disabled: !["running", "paused"].includes(s.state), onclick: () => act("stop") }, "Stop"),
          h("button", { type: "button", disabled: s.state !== "running", onclick: () => act("fork") }, "Fork"),
          h("button", { type: "button", class: "danger", disabled: s.state === "destroyed",
            onclick: () => confirm(`Destroy sandbox ${id}?`) && act(null, "DELETE") }, "Destroy")]);
      }
      rerender(journal, ops, () => table("Operations, oldest first", ["Kind", "State", "Created", "Result"],
        ops.operations.map((o) => [o.kind, stateBadge(o.state), when(o.created_at), summaryOf(o)]), "No operations yet."));
      rerender(snapshots, snaps, () => table("Snapshots, newest first", ["Snapshot", "Kind", "Name", "Status", "Size", "Created"],
        snaps.snapshots.map((x) => [h("span", { class: "mono" }, x.snapshot_id), x.kind, x.name || "—", stateBadge(x.status),
          `${x.size_bytes ?? 0} bytes`, when(x.created_at)]), "No snapshots."));
    } catch (e) {
      say(status, errorText(e), "error");
    }
  }
  every(REFRESH_MS, root, refresh);
  return root;
}

/** One line for an operation's receipt: an exec's exit, a service's start, an error. */
function summaryOf(o) {
  const r = o.result || {};
  if (r.error) return r.error;
  if (o.kind === "exec") return r.exit_code === null || r.exit_code === undefined ? "—" : `exit ${r.exit_code}`;
  if (o.kind === "service") {
    if (r.started) return `${r.name} started`;
    if (r.exit_code) return `${r.name} did not start (exit ${r.exit_code}): ${r.stderr || ""}`;
    return `${r.name} ended`;
  }
  return o.state === "done" ? "done" : "—";
}

/** A command to run, and its output as it is printed (followed until it ends). */
function execForm(id) {
  const status = notice();
  const command = h("input", { id: "exec-command", name: "command", required: true, spellcheck: "false",
    placeholder: "ls -la", autocomplete: "off" });
  const views = {
    stdout: tailView({ class: "output", id: "exec-stdout", tabindex: "0", "aria-label": "Standard output", "aria-live": "off" }),
    stderr: tailView({ class: "output", id: "exec-stderr", tabindex: "0", "aria-label": "Standard error", "aria-live": "off" }),
  };
  const run = h("button", { type: "submit", class: "primary" }, "Run");
  const form = h("form", { class: "filters", onsubmit: async (event) => {
    event.preventDefault();
    run.disabled = true;
    views.stdout.clear();
    views.stderr.clear();
    say(status, "Running…");
    try {
      const op = await api("POST", `/api/v1/sandboxes/${id}/exec?wait=false`,
        { argv: ["sh", "-c", command.value], timeout_sec: 600 });
      await follow(id, op.operation_id, views, status);
    } catch (e) {
      say(status, errorText(e), "error");
    } finally {
      run.disabled = false;
    }
  } }, h("label", { for: "exec-command" }, "Command (sh -c)"), command, run);
  return h("section", { "aria-labelledby": "exec-title" }, h("h2", { id: "exec-title" }, "Run a command"),
    form, status, h("h3", {}, "stdout"), views.stdout.pre, views.stdout.bar,
    h("h3", {}, "stderr"), views.stderr.pre, views.stderr.bar);
}

/** Shows the exec's stdout and stderr as they are printed, then how it ended. */
async function follow(id, operation, views, status) {
  const base = `/api/v1/sandboxes/${id}/operations/${operation}`;
  // Each stream until its `end` (the command left running) or a refusal; leaving the
  // page stops them.
  const refusals = await Promise.all(Object.entries(views).map(([name, view]) => new Promise((resolve) => {
    stream(`${base}/output?stream=${name}&follow=true`, {
      root: view.pre,
      onEvent: ({ event, data }) => {
        if (event === "output") view.append(JSON.parse(data).text);
      },
      onState: (state, error) => state === "ended" && resolve(error),
    });
  })));
  // Its receipt, once the operation leaves running (another owner may still run it).
  let op = await api("GET", base);
  while (["pending", "running"].includes(op.state) && views.stdout.pre.isConnected) {
    await new Promise((resolve) => setTimeout(resolve, RECEIPT_MS));
    op = await api("GET", base);
  }
  const refused = refusals.find(Boolean);
  const r = op.result || {};
  if (refused) say(status, `Ended: ${summaryOf(op)}. Its output could not be shown: ${errorText(refused)}`, "error");
  else say(status, r.exit_code === 0 ? "Exited 0." : `Ended: ${summaryOf(op)}.`, r.exit_code === 0 ? "ok" : "error");
}
