// Calls to /api/v1 with the user's token, asked for on the first 401 and kept in
// localStorage so it survives reloads. The token says who the page acts as: a user's own
// (ty_…, from `trainyard tokens create`) or the server's TRAINYARD_API_TOKEN (the
// bootstrap admin). A server without one takes a request without a token as admin.

const TOKEN_KEY = "trainyard.apiToken";
/** Dispatched on window when a token is saved from the dialog. */
export const TOKEN_SAVED = "trainyard:token-saved";
// Relative, like every URL of the page, so a proxy may mount the app under a prefix.
const API = "api/v1";

export class ApiError extends Error {
  constructor(status, detail) {
    super(describe(detail) || `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

/** A readable sentence for a {"detail": …} body: a string, or FastAPI's error list. */
export function describe(detail) {
  if (Array.isArray(detail)) return detail.map((e) => `${fieldOf(e)}: ${e.msg}`).join("\n");
  return typeof detail === "string" ? detail : "";
}

/** "params.hidden" for an error at loc ["body", "params", "hidden"]. */
export function fieldOf(error) {
  const loc = (error.loc || []).filter((part, i) => !(i === 0 && part === "body"));
  return loc.length ? loc.join(".") : "request";
}

export function apiUrl(path) {
  return API + path;
}

export function authHeaders() {
  const token = localStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

export function hasToken() {
  return localStorage.getItem(TOKEN_KEY) !== null;
}

/** Sign out: requests go without a token until another is entered. */
export function forgetToken() {
  localStorage.removeItem(TOKEN_KEY);
}

let asking = null;

/** Ask for the token once, however many requests were refused meanwhile. */
export function askToken() {
  asking ??= new Promise((resolve, reject) => {
    const dialog = document.getElementById("token-dialog");
    const input = document.getElementById("token-input");
    // A token is still stored only when the server refused it.
    document.getElementById("token-error").hidden = !hasToken();
    input.value = "";
    dialog.returnValue = ""; // else Escape would close with the last time's "save"
    dialog.addEventListener(
      "close",
      () => {
        asking = null;
        const token = input.value.trim();
        if (dialog.returnValue !== "save" || !token) {
          reject(new ApiError(401, "not signed in: use “sign in” at the top of the page"));
          return;
        }
        localStorage.setItem(TOKEN_KEY, token);
        window.dispatchEvent(new Event(TOKEN_SAVED));
        resolve();
      },
      { once: true },
    );
    dialog.showModal();
  });
  return asking;
}

/**
 * fetch() with the token; on a 401 asks for a token and tries again. Returns the
 * response for any other status.
 */
export async function authorizedFetch(url, init = {}) {
  for (;;) {
    const sent = localStorage.getItem(TOKEN_KEY);
    const response = await fetch(url, {
      ...init,
      headers: { ...init.headers, ...authHeaders() },
    });
    if (response.status !== 401) return response;
    // Another request may have stored a new token while this one was in flight.
    if (localStorage.getItem(TOKEN_KEY) === sent) await askToken();
  }
}

async function request(method, path, body, { signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await authorizedFetch(apiUrl(path), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data?.detail ?? response.statusText);
  return data;
}

export const api = {
  get: (path, opts) => request("GET", path, undefined, opts),
  post: (path, body, opts) => request("POST", path, body, opts),
};

/** The app's OpenAPI document (served without a token). */
export async function openapi() {
  const response = await fetch("openapi.json");
  if (!response.ok) throw new ApiError(response.status, "could not load openapi.json");
  return response.json();
}
