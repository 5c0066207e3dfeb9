"""Where the Ray dashboard's sign-in token is, said without the token itself.

Ray 2.60's dashboard under token auth (``RAY_AUTH_MODE=token``) opens on an
"Authentication Token Required" dialog. The token pasted there is checked by
``POST /api/authenticate``, which sets the HttpOnly cookie ``ray-authentication-token``
that every later dashboard request sends; the page then reloads. There is no query
parameter or header a link could carry instead. Requests made before the sign-in answer
401, which the job page shows as "Job Query Error Please Check JobId" until that reload.

So the link (``#/jobs/<submission id>``, which the dashboard's job API resolves) stays as
it is and etrain says where the token is: the embedded head's token file, the variable
or file an existing cluster's token comes from, or the KubeRay Secret holding it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from service.settings.slices import RaySettings

SIGN_IN = "sign in with the Ray token"


def token_source(ray: RaySettings, environ: Mapping[str, str] | None = None) -> str | None:
    """Where the Ray token of the cluster jobs run on is (a path or a name; never the
    token), or None when that cluster has no token auth."""
    env = os.environ if environ is None else environ
    if ray.backend == "kuberay":
        secret = ray.kuberay.ray_auth_secret
        if not secret:
            return None
        return f"Secret {secret} (key auth_token) of namespace {ray.kuberay.namespace}"
    if env.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN environment variable of etrain serve"
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return str(Path(env["RAY_AUTH_TOKEN_PATH"]))
    if env.get("RAY_AUTH_MODE") == "token":
        return f"{Path('~/.ray/auth_token')} of the user running etrain serve"
    return None


def token_hint(ray: RaySettings, environ: Mapping[str, str] | None = None) -> str | None:
    """``sign in with the Ray token in <where>`` (None without token auth)."""
    where = token_source(ray, environ)
    return None if where is None else f"{SIGN_IN} in {where}"
