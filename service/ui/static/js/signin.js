// Sign in: the token is checked with GET /v1/jobs?limit=1 and kept in sessionStorage.
import { setToken } from "./api.js";
import { $, showError } from "./dom.js";

function next() {
  const target = new URLSearchParams(location.search).get("next") || "/ui/";
  // Only a path of this site (never another origin).
  return target.startsWith("/ui") && !target.startsWith("//") ? target : "/ui/";
}

async function signIn(event) {
  event.preventDefault();
  const value = $("token").value.trim();
  const button = $("signin-button");
  button.disabled = true;
  try {
    const r = await fetch("/v1/jobs?limit=1", { headers: { Authorization: "Bearer " + value } });
    if (r.status === 401 || r.status === 403) {
      showError($("error"), "That token is not valid: check it and try again.");
      return;
    }
    if (!r.ok) {
      showError($("error"), `The service answered ${r.status}; try again.`);
      return;
    }
    setToken(value);
    location.assign(next());
  } catch (err) {
    showError($("error"), "The service cannot be reached: " + err.message);
  } finally {
    button.disabled = false;
  }
}

$("signin-form").addEventListener("submit", signIn);
$("token").focus();
