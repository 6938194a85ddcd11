// Who the page acts as (GET /api/v1/me for the stored token), shown in the header with
// the action that signs in as someone else.

import { api, askToken, forgetToken, hasToken, TOKEN_SAVED } from "./api.js";
import { fill, h } from "./dom.js";

let current = null; // a promise of {name, admin, tokenless}; null: ask again

/**
 * The signed-in user: {name, admin, tokenless}; tokenless when the server took a
 * request without a token (a loopback server without TRAINYARD_API_TOKEN) as admin.
 */
export function whoAmI() {
  current ??= api.get("/me").then(
    (me) => ({ ...me, tokenless: !hasToken() }),
    (err) => {
      current = null; // not signed in: the next caller asks again
      throw err;
    },
  );
  return current;
}

/**
 * Whether ``me`` may cancel or rerun a job of ``owner``: the server's own rule
 * (service/users.py check_may_act), so the page offers these to exactly whom it allows.
 */
export function mayAct(me, owner) {
  return me.admin || me.name === owner;
}

/**
 * Fill the header's #who and wire its #switch-user button; ``onSwitch`` runs after the
 * user signed in as someone else (or signed out), so the view can redraw for them.
 */
export function mountSession(onSwitch) {
  const who = document.getElementById("who");
  const button = document.getElementById("switch-user");
  let drawn = 0; // answers to an older question are dropped

  async function draw() {
    const mine = ++drawn;
    try {
      const me = await whoAmI();
      if (mine !== drawn) return;
      who.dataset.user = me.name;
      fill(
        who,
        me.tokenless ? "" : "signed in as ",
        h("strong", {}, me.name),
        me.tokenless ? " (no token needed here)" : me.admin ? " (admin)" : "",
      );
      fill(button, me.tokenless ? "sign in as a user" : "switch user");
    } catch {
      if (mine !== drawn) return;
      who.dataset.user = "";
      fill(who, "not signed in");
      fill(button, "sign in");
    }
  }

  // A token entered after a refused request: the header follows (the request is retried
  // by whoever sent it; the view is not redrawn, so a half-filled form survives).
  window.addEventListener(TOKEN_SAVED, () => {
    current = null;
    draw();
  });
  button.addEventListener("click", async () => {
    forgetToken();
    current = null;
    try {
      await askToken();
    } catch {
      // cancelled: stay signed out (or, on a server without a token, admin)
    }
    current = null;
    draw();
    onSwitch();
  });
  draw();
}
