// What every page shares: the API client, the signed-in session, DOM building,
// formatting and the storage of saved decisions.

const TOKEN_KEY = "cairn.token";

export const session = { token: null, role: null, name: null, tokenId: null };

const RANK = { viewer: 0, operator: 1, admin: 2 };

/** Whether the signed-in token has at least `role`. */
export function can(role) {
  return session.role !== null && RANK[session.role] >= RANK[role];
}

export function storedToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function keepToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function forgetToken() {
  try {
    sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Nothing kept, nothing to forget.
  }
  session.token = null;
  session.role = null;
  session.name = null;
  session.tokenId = null;
}

/** An API failure: the HTTP status and the API's error body, or a network failure. */
export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

/**
 * Calls the API with the session's token. Resolves to the parsed JSON (or a Blob when
 * `raw`); rejects with ApiError. A 401 signs the page out.
 */
export async function api(method, path, body, { raw = false } = {}) {
  const headers = { Authorization: `Bearer ${session.token}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "network", `The scheduler did not answer (${e.message}).`);
  }
  if (response.status === 401) {
    forgetToken();
    window.dispatchEvent(new CustomEvent("cairn:signed-out", { detail: "The token was refused: sign in again." }));
    throw new ApiError(401, "unauthorized", "The token was refused.");
  }
  if (!response.ok) {
    let detail = {};
    try {
      detail = (await response.json()).error || {};
    } catch {
      // Not the API's body (a proxy's page): keep the status alone.
    }
    throw new ApiError(response.status, detail.code || "http_" + response.status,
      detail.message || `HTTP ${response.status}`, detail.field);
  }
  if (raw) return response.blob();
  return response.json();
}

/** Builds an element: h("a", {href: "#"}, "text", child). Text is never parsed as HTML. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** What identifies a focusable element across two renderings of the same data. */
function focusKey(el) {
  return [el.tagName, el.id, el.getAttribute("href"), el.getAttribute("aria-label"), el.textContent.trim()].join("|");
}

/**
 * Replaces `container`'s children, unless `data` (what they were built from) is the same
 * as last time; keeps the keyboard focus on the same control when it was inside. A
 * periodic refresh thus never moves a keyboard user's place.
 */
export function rerender(container, data, build) {
  const text = JSON.stringify(data);
  if (container.dataset.rendered === text) return;
  const active = document.activeElement;
  const key = active && active !== container && container.contains(active) ? focusKey(active) : null;
  container.replaceChildren(...[build()].flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  container.dataset.rendered = text;
  if (key) {
    const again = [...container.querySelectorAll("a, button, input, select, [tabindex]")].find((e) => focusKey(e) === key);
    if (again) again.focus({ preventScroll: true });
  }
}

/** A table with a caption; rows are arrays of cells (strings or nodes). */
export function table(caption, headings, rows, empty = "None.") {
  if (rows.length === 0) return h("p", { class: "empty" }, empty);
  return h("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": caption },
    h("table", {},
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, headings.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, c)))))));
}

/** A definition list of [term, value] pairs. */
export function facts(pairs) {
  return h("dl", { class: "facts" },
    pairs.filter(([, v]) => v !== undefined).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

/** A status line read by screen readers when it changes. */
export function notice(kind = "info") {
  return h("p", { class: `notice ${kind}`, role: "status", "aria-live": "polite" });
}

export function say(el, text, kind = "info") {
  el.className = `notice ${kind}`;
  el.textContent = text;
}

export function errorText(e) {
  if (e instanceof ApiError) {
    const field = e.field ? ` (${e.field})` : "";
    return e.status ? `${e.message}${field} [${e.status} ${e.code}]` : e.message;
  }
  return String(e && e.message ? e.message : e);
}

export function stateBadge(state) {
  return h("span", { class: `badge s-${state}` }, state.replaceAll("_", " "));
}

export function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function seconds(ms) {
  return ms === null || ms === undefined ? "—" : `${(ms / 1000).toFixed(1)} s`;
}

export function newId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Repeats `tick` every `ms` while the page shows `root`; returns a stop function. */
export function every(ms, root, tick) {
  let timer = null;
  let stopped = false;
  let busy = false;
  const loop = async () => {
    if (stopped || !root.isConnected) return;
    busy = true;
    try {
      // A tab nobody looks at asks the API nothing; it catches up when shown again.
      if (!document.hidden) await tick();
    } finally {
      busy = false;
      if (!stopped && root.isConnected) timer = setTimeout(loop, ms);
    }
  };
  const onShow = () => {
    if (stopped || !root.isConnected) {
      document.removeEventListener("visibilitychange", onShow);
    } else if (!document.hidden && !busy) {
      clearTimeout(timer);
      loop();
    }
  };
  document.addEventListener("visibilitychange", onShow);
  // The first tick waits for the caller to put `root` on the page.
  timer = setTimeout(loop, 0);
  return () => {
    stopped = true;
    document.removeEventListener("visibilitychange", onShow);
    clearTimeout(timer);
  };
}

// Saved decisions: the action id and the exact body are kept in localStorage before a
// POST, so that a lost response or a reload never leads to a second, different
// submission. The page reads them back and refuses to submit if they did not stick.

const DECISION_PREFIX = "cairn.decision.";

export function savedDecision(key) {
  try {
    const text = localStorage.getItem(DECISION_PREFIX + key);
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

/** Keeps a decision, or throws when the browser does not keep it exactly. */
export function saveDecision(key, decision) {
  const text = JSON.stringify(decision);
  localStorage.setItem(DECISION_PREFIX + key, text);
  if (localStorage.getItem(DECISION_PREFIX + key) !== text) {
    throw new Error("the browser did not keep it");
  }
}

/** The keys (without the prefix) of every saved decision starting with `start`. */
export function savedDecisionKeys(start) {
  try {
    return Object.keys(localStorage)
      .filter((k) => k.startsWith(DECISION_PREFIX + start))
      .map((k) => k.slice(DECISION_PREFIX.length));
  } catch {
    return [];
  }
}

export function forgetDecision(key) {
  try {
    localStorage.removeItem(DECISION_PREFIX + key);
  } catch {
    // It could not be read either; nothing to forget.
  }
}

export function markDecision(key, fields) {
  const decision = savedDecision(key);
  if (!decision) return;
  try {
    localStorage.setItem(DECISION_PREFIX + key, JSON.stringify({ ...decision, ...fields }));
  } catch {
    // The decision itself is kept; only this note about it is lost.
  }
}
