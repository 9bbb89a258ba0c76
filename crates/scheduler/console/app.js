// The console's entry: sign-in, the navigation and the routes (#/overview, #/runs,
// #/runs/ID/TAB, #/sandboxes, #/sandboxes/ID, #/operations, #/connections; an empty
// address shows Runs).

import { api, errorText, forgetToken, h, keepToken, session, storedToken, can } from "./core.js";
import { runsPage } from "./runs.js";
import { runPage } from "./run.js";
import { operationsPage } from "./operations.js";
import { overviewPage } from "./overview.js";
import { connectionsPage } from "./connections.js";
import { sandboxesPage, sandboxPage } from "./sandboxes.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const signout = document.getElementById("signout");

function show(title, ...content) {
  document.title = `${title} · Cairn console`;
  main.replaceChildren(...content);
}

function signInPage(message, kind = "error") {
  nav.hidden = true;
  signout.hidden = true;
  who.textContent = "";
  const status = h("p", { class: `notice ${kind}`, role: "status", "aria-live": "polite" }, message || "");
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const form = h("form", { class: "card signin", onsubmit: async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    session.token = token;
    try {
      await signIn(token);
      keepToken(token);
      location.hash = location.hash && location.hash !== "#/signin" ? location.hash : "#/runs";
      route();
    } catch (e) {
      forgetToken();
      status.className = "notice error";
      status.textContent = e.status === 401 ? "That token was refused." : errorText(e);
    }
  } },
  h("h1", {}, "Sign in"),
  h("p", {}, "Paste a Cairn API token. It stays in this tab's session storage and goes only to this scheduler."),
  h("label", { for: "token" }, "API token"), input,
  h("button", { type: "submit", class: "primary" }, "Sign in"),
  status);
  show("Sign in", form);
  input.focus();
}

async function signIn(token) {
  session.token = token;
  const me = await api("GET", "/api/v1/session");
  session.role = me.role;
  session.name = me.name;
  session.tokenId = me.token_id;
  // Absent for a platform token; a tenant's token sees no fleet-wide page.
  session.tenant = me.tenant ?? null;
  who.textContent = `${me.name} · ${me.role}`;
  nav.hidden = false;
  signout.hidden = false;
  for (const link of nav.querySelectorAll("[data-role]")) {
    link.hidden = !can(link.dataset.role);
  }
}

function markSection(section) {
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

async function route() {
  if (!session.role) {
    const token = storedToken();
    if (!token) return signInPage();
    try {
      await signIn(token);
    } catch (e) {
      forgetToken();
      return signInPage(e.status === 401 ? "The saved token was refused: sign in again." : errorText(e));
    }
  }
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const [section, id, tab] = (path || "runs").split("/");
  markSection(section);
  if (section === "runs" && id && !/^[0-9a-f]{32}$/.test(id)) {
    show("Not a run", h("section", { class: "page" }, h("h1", {}, "Not a run id"),
      h("p", {}, "Run ids are 32 lowercase hexadecimal characters. "), h("a", { href: "#/runs" }, "All runs")));
  } else if (section === "runs" && id) {
    show(`Run ${id}`, runPage(id, tab || "overview"));
  } else if (section === "sandboxes" && id && !/^[0-9a-f]{32}$/.test(id)) {
    show("Not a sandbox", h("section", { class: "page" }, h("h1", {}, "Not a sandbox id"),
      h("p", {}, "Sandbox ids are 32 lowercase hexadecimal characters. "), h("a", { href: "#/sandboxes" }, "All sandboxes")));
  } else if (section === "sandboxes" && id) {
    show(`Sandbox ${id}`, sandboxPage(id));
  } else if (section === "sandboxes") {
    show("Sandboxes", sandboxesPage(new URLSearchParams(query || "")));
  } else if (section === "overview") {
    show("Overview", overviewPage(new URLSearchParams(query || "")));
  } else if (section === "operations") {
    show("Operations", operationsPage());
  } else if (section === "connections") {
    show("Connections", connectionsPage());
  } else {
    show("Runs", runsPage(new URLSearchParams(query || "")));
  }
  main.focus({ preventScroll: true });
}

// The skip link's "#main" would be read as a route (and show Runs): it moves the focus
// itself instead.
document.querySelector("a.skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});

signout.addEventListener("click", () => {
  forgetToken();
  // Replacing the address does not fire hashchange, so the message stays.
  history.replaceState(null, "", "#/runs");
  signInPage("Signed out.", "info");
});
window.addEventListener("cairn:signed-out", (event) => signInPage(event.detail));
window.addEventListener("hashchange", route);
route();
