"""What the deploy manifests and the Helm chart must give the control-plane container."""

from __future__ import annotations

# The Secret key KubeRay's operator reads a cluster's token from (authOptions.secretName).
RAY_AUTH_TOKEN_KEY = "auth_token"


def ray_auth_env(secret_name: str) -> list[dict]:
    """Container env that makes Ray clients (job API, logs) authenticate with the cluster token."""
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {
            "name": "RAY_AUTH_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": secret_name, "key": RAY_AUTH_TOKEN_KEY}},
        },
    ]
