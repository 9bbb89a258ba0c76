// One run: its state and budgets, the timeline of its steps (executed or reused, at
// which epoch, by which worker), output tails and downloads, checkpoints and the resume
// context, and the actions the signed-in role may take. Plan, Agent questions and
// Verification are tabs.

import { api, can, debounce, errorText, every, facts, h, notice, rerender, say, seconds, stateBadge, stream, table, tailView, when } from "./core.js";
import { planTab } from "./plan.js";
import { questionsTab } from "./questions.js";
import { receipts } from "./records.js";
import { loadReconciliation, reconciliation } from "./reconcile.js";
import { verificationTab } from "./verification.js";

const TERMINAL = ["completed", "failed", "cancelled"];
const TABS = [["overview", "Overview"], ["plan", "Plan"], ["questions", "Agent questions"], ["verification", "Verification"]];
// The run's feed and its steps' output streams say when to reload; this slow one
// catches whatever they could not say.
const SAFETY_MS = 15000;
// Polling, as before the feed, while the feed or a step's output stream is unavailable.
const FALLBACK_MS = 2000;
const LIVE_TAIL_BYTES = 4096;
const FEED_TEXT = { connecting: "Connecting…", live: "Live", reconnecting: "Reconnecting…", ended: `Refreshed every ${FALLBACK_MS / 1000} s` };

export function runPage(runId, tab) {
  const current = TABS.some(([id]) => id === tab) ? tab : "overview";
  const header = h("div", { class: "heading" }, h("h1", {}, "Run ", h("span", { class: "mono" }, runId)));
  const tabs = h("nav", { class: "tabs", "aria-label": "Run sections" },
    TABS.map(([id, label]) => h("a", { href: `#/runs/${runId}/${id}`, "aria-current": id === current ? "page" : false }, label)));
  const body = h("div", {});
  const root = h("section", { class: "page" }, h("p", {}, h("a", { href: "#/runs" }, "← All runs")), header, tabs, body);
  if (current === "plan") body.append(planTab(runId));
  else if (current === "questions") body.append(questionsTab(runId));
  else if (current === "verification") body.append(verificationTab(runId));
  else body.append(overview(runId));
  return root;
}

/** "executed at epoch 3 by w1", or "reused from its receipt of epoch 1". */
function how(step, reusedKeys, run, request) {
  if (step.request_id !== run.request_id) return `earlier request, epoch ${step.intent_epoch}`;
  if (running(step, run, request)) return `running at epoch ${step.intent_epoch}${step.worker ? ` on ${step.worker}` : ""}`;
  if (reusedKeys.has(step.step_key) && step.receipt_epoch !== null) {
    return `reused from its receipt of epoch ${step.receipt_epoch}`;
  }
  const by = step.worker ? ` by ${step.worker}` : "";
  if (step.status === "unknown_outcome") return `started at epoch ${step.intent_epoch}${by}, its end not recorded`;
  return `executed at epoch ${step.intent_epoch}${by}`;
}

/** Whether the step is running now: no receipt yet, under the lease the run holds. */
function running(step, run, request) {
  return step.status === "unknown_outcome" && run.state === "running"
    && step.request_id === run.request_id && step.intent_epoch === request.lease_epoch;
}

function outcome(step, run, request) {
  if (running(step, run, request)) return "running";
  if (step.status === "unknown_outcome") return "unknown outcome: started, its end not recorded";
  if (step.status !== "failed") return step.status.replaceAll("_", " ");
  if (step.limit) return `failed: passed its ${step.limit}`;
  if (step.signal !== null) return `failed: signal ${step.signal}`;
  if (step.timed_out) return "failed: timed out";
  return `failed: exit ${step.exit_code}`;
}

/** The end of each running step's stdout, as the API serves it now. */
async function liveTails(runId, steps) {
  const tails = {};
  await Promise.all(steps.map(async (s) => {
    try {
      const blob = await api("GET", `/api/v1/runs/${runId}/steps/${encodeURIComponent(s.step_key)}/output?stream=stdout&tail_bytes=${LIVE_TAIL_BYTES}`, undefined, { raw: true });
      // Bytes that are not UTF-8 show as U+FFFD; the download keeps them exactly.
      tails[s.step_key] = new TextDecoder().decode(await blob.arrayBuffer());
    } catch (e) {
      tails[s.step_key] = `(live output unavailable: ${errorText(e)})`;
    }
  }));
  return tails;
}

/**
 * Follows a running step's stdout as it is printed, into a view the page keeps across
 * its re-renders. Its `mode` turns "ended" when the attempt ends, or "tail" when the
 * output cannot be followed (the page then reads its tail, as before); both reload.
 */
function followStep(runId, step, reload) {
  const view = tailView({ class: "tail", tabindex: "0", "aria-label": `${step.step_key} live stdout` });
  view.mode = "follow";
  view.stop = stream(`/api/v1/runs/${runId}/steps/${encodeURIComponent(step.step_key)}/output?stream=stdout&follow=true`, {
    root: view.pre,
    onEvent: ({ event, data }) => {
      if (event === "output") view.append(JSON.parse(data).text);
    },
    onState: (state, error) => {
      // Whatever ended the stream, the step may have ended with it: its receipt shows.
      if (state === "ended") view.mode = error ? "tail" : "ended";
      if (state === "ended" || state === "reconnecting") reload();
    },
  });
  return view;
}

async function download(runId, key, stream, status) {
  try {
    const blob = await api("GET", `/api/v1/runs/${runId}/steps/${encodeURIComponent(key)}/output?stream=${stream}`, undefined, { raw: true });
    const url = URL.createObjectURL(blob);
    const link = h("a", { href: url, download: `${runId}-${key}.${stream}` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) {
    say(status, `Could not download ${key} ${stream}: ${errorText(e)}`, "error");
  }
}

function actions(run, pause, status, reload) {
  if (!can("operator")) return null;
  const act = async (label, method, path, button) => {
    // Pause and resume wait for the worker (up to 30 s): one request at a time.
    button.disabled = true;
    say(status, `${label}: asking…`);
    try {
      await api(method, path);
      say(status, `${label}: asked.`, "ok");
    } catch (e) {
      say(status, `${label} failed: ${errorText(e)}`, "error");
    }
    reload();
  };
  const finished = TERMINAL.includes(run.state);
  return h("div", { class: "actions", role: "group", "aria-label": "Run actions" },
    h("button", { type: "button", class: "danger", disabled: finished || !!run.cancel_requested_at,
      onclick: (e) => confirm("Cancel this run? Running steps are stopped.") && act("Cancel", "POST", `/api/v1/runs/${run.run_id}/cancel`, e.currentTarget) }, "Cancel run"),
    h("button", { type: "button", disabled: pause.state !== "running",
      onclick: (e) => act("Pause", "POST", `/api/v1/runs/${run.run_id}/pause`, e.currentTarget) }, "Pause"),
    h("button", { type: "button", disabled: !["paused", "pausing"].includes(pause.state),
      onclick: (e) => act("Resume", "POST", `/api/v1/runs/${run.run_id}/resume`, e.currentTarget) }, "Resume"));
}

function overview(runId) {
  const status = notice();
  const feedText = h("span", { class: "refreshed", "aria-live": "off", "data-feed": "connecting" });
  const content = h("div", {}, h("p", {}, "Loading…"));
  const root = h("div", {}, h("div", { class: "live" }, feedText), status, content);
  // The followed output of each running step (step key and epoch → view): its <pre>
  // is the same node from one render to the next, so appending to it goes on.
  const follows = new Map();
  let finished = false;
  let failing = false;
  // Running, but no step is: the next one's start changes no run row, so no event says it.
  let between = false;
  let feed = "connecting";
  let updated = null;
  const showFeed = () => {
    feedText.dataset.feed = finished ? "finished" : feed;
    const text = finished ? "Run finished" : FEED_TEXT[feed];
    feedText.textContent = `${text}${updated ? ` · updated ${updated.toLocaleTimeString()}` : ""}`;
  };
  const load = async () => {
    if (finished) return;
    try {
      const [run, journal, requests, pause] = await Promise.all([
        api("GET", `/api/v1/runs/${runId}`),
        api("GET", `/api/v1/runs/${runId}/journal`),
        api("GET", `/api/v1/runs/${runId}/execution-requests`),
        api("GET", `/api/v1/runs/${runId}/pause`),
      ]);
      const reconciling = await loadReconciliation(run);
      const request = requests.execution_requests.find((r) => r.request_id === run.request_id) || {};
      const reused = new Set((request.resume_context?.receipts || [])
        .filter((r) => r.standing === "on_tree").map((r) => r.step_key));
      const remaining = (max, used) => Math.max(0, max - used);
      // Plan steps only: verification checks keep their output with the worker, and
      // their tails are on the Verification tab.
      const planned = new Set(run.steps.map((p) => p.key));
      const mine = journal.steps.filter((s) => s.request_id === run.request_id && planned.has(s.step_key));
      const followKey = (s) => `${s.step_key}@${s.intent_epoch}`;
      const runningNow = new Map(mine.filter((s) => running(s, run, request)).map((s) => [followKey(s), s]));
      between = run.state === "running" && runningNow.size === 0;
      // A running step's output is followed, unless it cannot be: its tail is then read,
      // as for a step whose end went unrecorded.
      const readTail = (s) => s.receipt_epoch === null
        && (!runningNow.has(followKey(s)) || follows.get(followKey(s))?.mode === "tail");
      const live = await liveTails(runId, mine.filter(readTail));
      if (!root.isConnected) return;
      // A step that stopped running is no longer followed; one that started is.
      for (const [key, view] of follows) {
        if (!runningNow.has(key)) {
          view.stop();
          follows.delete(key);
        }
      }
      for (const [key, s] of runningNow) {
        if (!follows.has(key)) follows.set(key, followStep(runId, s, reload));
      }
      if (failing) {
        // The fault healed: its message goes (an action's message stays).
        failing = false;
        say(status, "");
      }
      const views = [...follows.values()];
      views.forEach((v) => v.save());
      const modes = [...follows].map(([key, v]) => [key, v.mode]);
      rerender(content, { run, journal, requests, pause, live, reconciling, modes }, () => [
        facts([
          ["State", stateBadge(run.state)],
          ["Stop reason", run.stop_reason || "—"],
          ["Needs a decision on", run.reconciliation_step ? `step ${run.reconciliation_step} (started, its end not recorded)` : "—"],
          ["Pause", pause.state.replaceAll("_", " ")],
          ["Agent", run.agent],
          ["Attempt", `${run.attempt} of ${run.max_attempts}`],
          ["Commands", `${run.usage.commands} used, ${remaining(run.budgets.max_commands, run.usage.commands)} of ${run.budgets.max_commands} left`],
          ["Wall time", `${seconds(run.usage.wall_ms)} used, ${remaining(run.budgets.max_wall_seconds, Math.ceil(run.usage.wall_ms / 1000))} s of ${run.budgets.max_wall_seconds} s left`],
          ["CPU time", seconds(run.usage.cpu_ms)],
          ["Lease", request.lease_owner ? `held by ${request.lease_owner} at epoch ${request.lease_epoch} until ${when(request.lease_deadline)}` : `epoch ${request.lease_epoch ?? "—"}, not held`],
          ["Deadline", run.deadline ? when(run.deadline) : "none"],
          ["Created", when(run.created_at)],
          ["Finished", when(run.finished_at)],
        ]),
        actions(run, pause, status, reload.now) || "",
        reconciliation(run, reconciling, status, reload.now) || "",
        h("h2", {}, "Timeline"),
        table("Steps in plan order", ["Step", "Outcome", "How", "Wall", "Started", "Tree"],
          run.steps.map((spec) => {
            const step = journal.steps.filter((s) => s.step_key === spec.key).pop();
            if (!step) return [spec.key, "pending", "—", "—", "—", "—"];
            return [spec.key, outcome(step, run, request), how(step, reused, run, request), seconds(step.wall_ms), when(step.started_at),
              step.tree_tier ? `${step.tree_tier}${step.snapshot_id ? ` → ${step.snapshot_id}` : ""}` : "—"];
          }), undefined, { stack: true }),
        h("h2", {}, "Output"),
        journal.steps.length === 0 ? h("p", { class: "empty" }, "No step has started.") :
          h("div", { class: "outputs" }, mine.map((s) =>
            h("article", { class: "output", "aria-label": `Output of ${s.step_key}` },
              h("h3", {}, s.step_key),
              s.step_key in live
                ? [h("p", { class: "muted" }, running(s, run, request)
                  ? `Live: the last ${LIVE_TAIL_BYTES / 1024} KiB of stdout, read every ${FALLBACK_MS / 1000} s.`
                  : `No receipt: the last ${LIVE_TAIL_BYTES / 1024} KiB of stdout it printed before its end went unrecorded.`),
                  h("pre", { class: "tail", tabindex: "0", "aria-label": `${s.step_key} live stdout` }, live[s.step_key] || "(nothing printed yet)")]
                : follows.has(followKey(s))
                  ? [h("p", { class: "muted" }, "Live: stdout as it is printed (the last 256 KiB; Download has all of it)."),
                    follows.get(followKey(s)).pre, follows.get(followKey(s)).bar]
                  : [h("p", { class: "muted" }, "Last lines, as recorded with the receipt (bytes that are not text are escaped)."),
                    h("pre", { class: "tail", tabindex: "0", "aria-label": `${s.step_key} stdout tail` }, s.stdout_tail || "(no stdout)"),
                    s.stderr_tail ? h("pre", { class: "tail err", tabindex: "0", "aria-label": `${s.step_key} stderr tail` }, s.stderr_tail) : null],
              h("div", { class: "actions" },
                h("button", { type: "button", onclick: () => download(runId, s.step_key, "stdout", status) }, `Download ${s.step_key} stdout`),
                h("button", { type: "button", onclick: () => download(runId, s.step_key, "stderr", status) }, `Download ${s.step_key} stderr`))))),
        h("h2", {}, "Checkpoints"),
        facts([["This attempt's tree", request.resume_context?.restore_tier
          ? `restored from tier ${request.resume_context.restore_tier}${request.resume_context.snapshot_id ? ` (snapshot ${request.resume_context.snapshot_id})` : ""}`
          : "the first attempt's own"]]),
        table("Checkpoint lineage: the snapshot each receipt stands on, in step order", ["After step", "Snapshot", "Receipt epoch", "Tree tier"],
          journal.steps.filter((s) => s.request_id === run.request_id && s.snapshot_id).map((s) => [
            s.step_key, h("span", { class: "mono" }, s.snapshot_id), String(s.receipt_epoch), s.tree_tier || "—"]),
          "No checkpoint yet: none is taken before a step's receipt."),
        table("Execution requests and their retained checkpoints", ["Request", "Kind", "State", "Epoch", "Checkpoint"],
          requests.execution_requests.map((r) => [h("span", { class: "mono" }, r.request_id), r.kind, stateBadge(r.state === "executing" ? "running" : r.state),
            String(r.lease_epoch), r.checkpoint ? JSON.stringify(r.checkpoint) : "—"])),
        h("h3", {}, "Resume context"),
        h("pre", { class: "json", tabindex: "0", "aria-label": "Resume context" }, request.resume_context ? JSON.stringify(request.resume_context, null, 2) : "None: the run has not resumed."),
        receipts(runId, { journal })]);
      views.forEach((v) => v.restore());
      updated = new Date();
      if (TERMINAL.includes(run.state)) finish();
      showFeed();
    } catch (e) {
      if (e.status === 404) {
        finish();
        content.replaceChildren(h("p", { class: "empty" }, "No such run."), h("a", { href: "#/runs" }, "All runs"));
      }
      failing = true;
      say(status, errorText(e), "error");
    }
  };
  const reload = debounce(250, load);
  // The first load, and a slow safety one.
  every(SAFETY_MS, root, reload.now);
  // Polling while the feed is unavailable, between two steps, or while a step's output
  // is read rather than followed (or its stream ended before the journal shows its end).
  const polled = () => feed === "ended" || between || [...follows.values()].some((v) => v.mode !== "follow");
  every(FALLBACK_MS, root, () => polled() && reload.now());
  const stopFeed = stream(`/api/v1/runs/events?run_id=${runId}`, {
    root,
    // `run`, `ready` (after a reconnect's replay) or `reset`: the run may differ.
    onEvent: () => reload(),
    onState: (state) => {
      feed = state;
      showFeed();
    },
  });
  function finish() {
    finished = true;
    stopFeed();
    showFeed();
  }
  return root;
}
