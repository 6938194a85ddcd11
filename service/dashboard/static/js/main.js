// The dashboard's router: the URL fragment picks a view (#/jobs, #/jobs/7, #/submit,
// #/sweeps, #/sweeps/3, #/compare?jobs=7,8, #/team).
// A view draws itself into the main element and returns a function that stops its
// timers and streams when another view replaces it.

import { compareView } from "./compare.js";
import { h } from "./dom.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { mountSession } from "./session.js";
import { submitView } from "./submit.js";
import { sweepView } from "./sweep.js";
import { sweepsView } from "./sweeps.js";
import { teamView } from "./team.js";

const ROUTES = [
  [/^#\/jobs\/(\d+)$/, "jobs", (root, match) => jobView(root, Number(match[1]))],
  [/^#\/jobs$/, "jobs", (root, _match, params) => jobsView(root, params)],
  [/^#\/compare$/, "jobs", (root, _match, params) => compareView(root, params)],
  [/^#\/sweeps\/(\d+)$/, "sweeps", (root, match) => sweepView(root, Number(match[1]))],
  [/^#\/sweeps$/, "sweeps", (root, _match, params) => sweepsView(root, params)],
  [/^#\/submit$/, "submit", (root) => submitView(root)],
  [/^#\/team$/, "team", (root, _match, params) => teamView(root, params)],
];

const root = document.getElementById("view");
let leave = () => {};

function route() {
  leave();
  leave = () => {};
  document.title = "Trainyard";
  const [path, query = ""] = (location.hash || "#/jobs").split("?");
  const found = ROUTES.map(([re, nav, view]) => [path.match(re), nav, view]).find(([m]) => m);
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("current", Boolean(found) && a.dataset.nav === found[1]);
  }
  if (!found) {
    root.replaceChildren(h("p", {}, "Nothing here. ", h("a", { href: "#/jobs" }, "See the jobs.")));
    return;
  }
  const [match, , view] = found;
  leave = view(root, match, new URLSearchParams(query)) ?? leave;
}

window.addEventListener("hashchange", route);
mountSession(route); // signed in as someone else: the view redraws for them
route();
