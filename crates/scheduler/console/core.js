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

/** Forgets the refused token and shows the sign-in page. */
function signOut() {
  forgetToken();
  window.dispatchEvent(new CustomEvent("cairn:signed-out", { detail: "The token was refused: sign in again." }));
  return new ApiError(401, "unauthorized", "The token was refused.");
}

/** The ApiError of a response that is not ok, from the API's error body when it has one. */
async function failure(response) {
  let detail = {};
  try {
    detail = (await response.json()).error || {};
  } catch {
    // Not the API's body (a proxy's page): keep the status alone.
  }
  return new ApiError(response.status, detail.code || "http_" + response.status,
    detail.message || `HTTP ${response.status}`, detail.field);
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
  if (response.status === 401) throw signOut();
  if (!response.ok) throw await failure(response);
  if (raw) return response.blob();
  return response.json();
}

const RETRY_FIRST_MS = 500;
const RETRY_LAST_MS = 10000;

/**
 * Reads the server-sent events of `path` with the session's token (EventSource cannot
 * send it). Calls onEvent({event, id, data}) for each event and onState(state, detail)
 * as the connection goes "connecting", "live", "reconnecting" (detail: why) or "ended"
 * (detail: the ApiError that stopped it; none when the server sent `end`). A dropped
 * connection is opened again after 0.5 s, doubling to 10 s, and resumes after the last
 * id seen (Last-Event-ID). A 4xx other than 429 ends it; a 401 also signs out. It stops
 * for good once `root` has left the page, or when the returned function is called.
 */
export function stream(path, { onEvent, onState = () => {}, root }) {
  let stopped = false;
  let lastId = null;
  let delay = RETRY_FIRST_MS;
  let timer = null;
  let abort = null;
  const gone = () => stopped || !session.token || (root && !root.isConnected);
  // An idle stream holds one of the few connections a browser opens to the scheduler:
  // it is closed as soon as its page is left, not at its next keep-alive.
  const check = () => gone() && stop();
  const onHash = () => setTimeout(check);
  const watch = setInterval(check, 1000);
  window.addEventListener("hashchange", onHash);
  function stop() {
    stopped = true;
    clearInterval(watch);
    clearTimeout(timer);
    window.removeEventListener("hashchange", onHash);
    if (abort) abort.abort();
  }
  const end = (detail) => {
    stop();
    onState("ended", detail);
  };
  const retry = (detail) => {
    if (gone()) return stop();
    onState("reconnecting", detail);
    timer = setTimeout(connect, delay);
    delay = Math.min(delay * 2, RETRY_LAST_MS);
  };

  /** Dispatches the events of `body`; true when the server ended it with `end`. */
  async function read(body) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let type = "";
    let data = [];
    // An event's id counts only once the whole event has arrived: a connection that
    // drops inside it must ask for that event again.
    let id = lastId;
    for (;;) {
      const { value, done } = await reader.read();
      if (done || gone()) return false;
      const text = buffer + decoder.decode(value, { stream: true });
      // A "\r\n" may be split across two reads: a trailing "\r" waits for the next.
      const held = text.endsWith("\r") ? 1 : 0;
      const lines = text.slice(0, text.length - held).split(/\r\n|\r|\n/);
      buffer = lines.pop() + text.slice(text.length - held);
      for (const line of lines) {
        if (line === "") {
          if (type || data.length) {
            lastId = id;
            onEvent({ event: type || "message", id: lastId, data: data.join("\n") });
            if (type === "end") return true;
            if (gone()) return false;
          }
          type = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue; // A comment: the server's keep-alive.
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") type = value;
        else if (field === "data") data.push(value);
        else if (field === "id" && !value.includes("\0")) id = value;
      }
    }
  }

  async function connect() {
    if (gone()) return stop();
    abort = new AbortController();
    const headers = { Authorization: `Bearer ${session.token}`, Accept: "text/event-stream" };
    if (lastId !== null) headers["Last-Event-ID"] = lastId;
    let response;
    try {
      response = await fetch(path, { headers, signal: abort.signal, cache: "no-store" });
    } catch (e) {
      if (!stopped) retry(new ApiError(0, "network", `The scheduler did not answer (${e.message}).`));
      return;
    }
    if (response.status === 401) return end(signOut());
    if (!response.ok) {
      const error = await failure(response);
      return response.status < 500 && response.status !== 429 ? end(error) : retry(error);
    }
    delay = RETRY_FIRST_MS;
    onState("live");
    try {
      if (await read(response.body)) return end();
    } catch (e) {
      if (!stopped) retry(new ApiError(0, "network", `The stream broke (${e.message}).`));
      return;
    }
    retry(new ApiError(0, "network", "The scheduler closed the stream."));
  }

  onState("connecting");
  // The first request waits for the caller to put `root` on the page.
  timer = setTimeout(connect, 0);
  return stop;
}

/**
 * Coalesces calls: `fn` runs once, `ms` after the first call of a burst (so a steady
 * stream of calls still runs it every `ms`), and never twice at once; `.now()` runs it
 * at once. `fn` handles its own errors.
 */
export function debounce(ms, fn) {
  let timer = null;
  let running = null;
  let again = false;
  const now = () => {
    clearTimeout(timer);
    timer = null;
    if (running) {
      again = true;
      return running;
    }
    running = Promise.resolve().then(fn).finally(() => {
      running = null;
      if (again) {
        again = false;
        later();
      }
    });
    return running;
  };
  const later = () => {
    timer ??= setTimeout(now, ms);
  };
  later.now = now;
  return later;
}

/**
 * A <pre> that follows its tail: text appended while the reader is at its end scrolls
 * it there; a reader who scrolled up keeps their place, is told so, and can jump back.
 * Only the last `keep` characters stay (a long output would slow the page down).
 * Put `pre` and `bar` on the page; the same nodes may be moved by a re-render, between
 * save() and restore().
 */
export function tailView(attrs, keep = 256 * 1024) {
  const pre = h("pre", { ...attrs, "data-following": "true" });
  const note = h("span", { class: "muted", hidden: true }, "Paused following: scrolled up");
  const jump = h("button", { type: "button", hidden: true, onclick: () => {
    toEnd();
    mark(true);
    // The button hides: the keyboard's place moves to the output it shows.
    pre.focus({ preventScroll: true });
  } }, "Jump to the end");
  const bar = h("div", { class: "follow" }, jump, note);
  let following = true;
  let size = 0;
  let saved = 0;
  // Where following last put the view: a scroll above it is the reader's; one back to
  // it is not (a tool that scrolls and restores, as axe-core does, must not pause it).
  let followedTo = 0;
  const atEnd = () => pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  const toEnd = () => {
    pre.scrollTop = pre.scrollHeight;
    followedTo = pre.scrollTop;
  };
  const mark = (on) => {
    following = on;
    pre.dataset.following = String(on);
    jump.hidden = on;
    note.hidden = on;
  };
  pre.addEventListener("scroll", () => mark(atEnd() || pre.scrollTop >= followedTo - 4));
  return {
    pre,
    bar,
    append(text) {
      // Only the reader's scrolling pauses following: text that wraps anew (a narrower
      // window) leaves a following view short of its end without a scroll.
      const stick = following || atEnd();
      pre.append(text);
      size += text.length;
      if (size > keep) {
        // The oldest lines go, from a line's start when there is one near the cut.
        const all = pre.textContent;
        const cut = all.indexOf("\n", all.length - keep);
        pre.textContent = all.slice(cut >= 0 && cut < all.length - keep + 4096 ? cut + 1 : all.length - keep);
        size = pre.textContent.length;
      }
      if (stick) toEnd();
      mark(stick);
    },
    clear() {
      pre.textContent = "";
      size = 0;
      followedTo = 0;
      mark(true);
    },
    // A node taken out of the page loses its scroll position.
    save() {
      saved = pre.scrollTop;
    },
    restore() {
      if (following) toEnd();
      else pre.scrollTop = saved;
    },
  };
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

/**
 * A table with a caption; rows are arrays of cells (strings or nodes). With `stack`, a
 * narrow screen shows each row as a card of labelled cells instead of scrolling sideways.
 */
export function table(caption, headings, rows, empty = "None.", { stack = false } = {}) {
  if (rows.length === 0) return h("p", { class: "empty" }, empty);
  return h("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": caption },
    h("table", { class: stack ? "stack" : null },
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, headings.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c, i) => h("td", { "data-label": headings[i] }, c)))))));
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
