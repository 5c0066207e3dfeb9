// The REST API as the pages use it: the signed-in token (sessionStorage) on every call.
const KEY = "etrain.token";

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(value) {
  sessionStorage.setItem(KEY, value);
}

export function signOut() {
  sessionStorage.removeItem(KEY);
  location.assign("/ui/signin");
}

// Go to the sign-in page (coming back here after) when there is no token.
export function requireToken() {
  if (token()) return true;
  const back = location.pathname + location.search;
  location.replace("/ui/signin?next=" + encodeURIComponent(back));
  return false;
}

export class ApiError extends Error {
  constructor(status, body) {
    super(describe(status, body));
    this.status = status;
    this.body = body;
  }
}

// One line per problem, the field first: FastAPI's {"detail": [{"loc", "msg"}]} or a string.
export function describe(status, body) {
  const detail = body && typeof body === "object" ? body.detail : body;
  if (Array.isArray(detail)) {
    return detail
      .map((d) => {
        const loc = Array.isArray(d.loc) ? d.loc.filter((p) => p !== "body").join(".") : "";
        return (loc ? loc + ": " : "") + (d.msg || JSON.stringify(d));
      })
      .join("\n");
  }
  if (typeof detail === "string" && detail) return `${status}: ${detail}`;
  return `HTTP ${status}`;
}

async function readBody(response) {
  const text = await response.text();
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return text;
  }
}

// fetch with the bearer token; JSON in and out. A 401 sends the user to sign in again.
export async function api(path, { method = "GET", body, type, raw = false, signal } = {}) {
  const headers = { Authorization: "Bearer " + (token() || "") };
  let payload = body;
  if (body !== undefined && type === undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  } else if (type) {
    headers["Content-Type"] = type;
  }
  const response = await fetch(path, { method, headers, body: payload, signal });
  if (response.status === 401 && !raw) {
    sessionStorage.removeItem(KEY);
    requireToken();
  }
  if (raw) return response;
  const data = await readBody(response);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// Run fn now and every `ms` while the tab is visible; returns stop().
export function poll(fn, ms = 2000) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    timer = null;
    if (stopped || document.visibilityState === "hidden") return;
    try {
      await fn();
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 401)) console.warn("poll:", err.message);
    }
    if (!stopped && document.visibilityState !== "hidden") timer = setTimeout(tick, ms);
  };
  const onVisibility = () => {
    if (document.visibilityState === "visible" && timer === null) tick();
  };
  document.addEventListener("visibilitychange", onVisibility);
  tick();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    document.removeEventListener("visibilitychange", onVisibility);
  };
}
