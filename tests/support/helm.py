"""helm/etrain rendered by Helm's own engine: in-process (helm-python-sdk: Helm's Go SDK)
for the unit tests, and by the real Helm 3 CLI for the integration tests."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "etrain"
NS = "ml"


def render(values: dict, *, release: str = "etrain") -> tuple[list[dict], str]:
    """The chart's objects and NOTES.txt, as `helm template` would print them."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=release, namespace=NS)
    objects = [
        doc
        for name, text in sorted(out.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return objects, out.get("etrain/templates/NOTES.txt", "")


def by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    """Objects by (kind, name)."""
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


# --- the real Helm 3 CLI ------------------------------------------------------------------
# `make helm` (run by `make test`) installs the pinned upstream binary into .tools/ and
# passes its path in ETRAIN_HELM.
DEFAULT_HELM = CHART.parents[1] / ".tools/helm-3.18.0/helm/helm"
HELM_INSTALL_HINT = (
    "run `make helm` (`make test` does: it installs the pinned Helm 3 into .tools/ "
    "with npm), or set ETRAIN_HELM to a helm 3 binary"
)
# What a cluster tells `helm install` about itself: (group/version, kind, plural), namespaced.
# The chart's kinds, and a Kubernetes 1.30 version.
DISCOVERY = (
    ("v1", "ConfigMap", "configmaps"),
    ("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    ("v1", "Secret", "secrets"),
    ("v1", "Service", "services"),
    ("v1", "ServiceAccount", "serviceaccounts"),
    ("apps/v1", "Deployment", "deployments"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("batch/v1", "Job", "jobs"),
    ("networking.k8s.io/v1", "Ingress", "ingresses"),
    ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    ("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    ("ray.io/v1", "RayCluster", "rayclusters"),
    ("ray.io/v1", "RayJob", "rayjobs"),
)
KUBE_VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "platform": "linux/amd64"}


def helm_path() -> Path:
    """The binary ETRAIN_HELM names, else the one `make helm` installs under .tools/."""
    configured = os.environ.get("ETRAIN_HELM")
    return Path(configured) if configured else DEFAULT_HELM


def discovery_documents() -> dict[str, dict]:
    """The API server's discovery answers (/version, /api, /apis, resource lists) by path."""
    by_gv: dict[str, list[dict]] = {}
    for gv, kind, plural in DISCOVERY:
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resource = {"name": plural, "singularName": "", "namespaced": True, "kind": kind}
        by_gv.setdefault(gv, []).append(resource | {"verbs": verbs})
    docs: dict[str, dict] = {
        "/version": KUBE_VERSION,
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    }
    groups = []
    for gv, resources in by_gv.items():
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        docs[path] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }
        if gv != "v1":
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    docs["/apis"] = {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    return docs


@contextlib.contextmanager
def discovery_server() -> Iterator[str]:
    """A loopback HTTP server answering only the API server's read-only discovery paths.

    Helm 3.18's ``install --dry-run=client`` still asks a cluster for its version and
    API groups (and fails without one), although it sends it nothing. Every other path
    is a 404, so anything that would change a cluster fails the test.
    """
    docs = discovery_documents()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            doc = docs.get(self.path.split("?")[0])
            body = json.dumps(doc if doc is not None else {"kind": "Status", "code": 404})
            self.send_response(200 if doc is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_helm(args: list[str], *, home: Path, server: str | None = None):
    """``helm ARGS`` with its own config/cache/data dirs under ``home`` (and a kubeconfig
    for ``server``); the CompletedProcess, stdout and stderr as text."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "kubeconfig"),
    }
    if server:
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "contexts": [{"name": "c", "context": {"cluster": "c"}}],
            "current-context": "c",
            "users": [],
        }
        (home / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    return subprocess.run(
        [str(helm_path()), *args], capture_output=True, text=True, timeout=120, env=env
    )
