"""Each service takes its slice of the settings, never ``Settings`` whole.

``Settings`` reads the flat ``ETRAIN_*`` environment; only the composition roots
(``service/api/app.py``, ``service/server.py``, ``service/reference.py``) hold it, and
they hand each service the slice it reads (``service/settings/slices.py``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest

from service import server
from service.backends import factory
from service.backends.ray_ports import RayPorts
from service.domain import access_policy, queue_view, ray_dashboard, reconciler, scheduler
from service.domain import submission as submission_module
from service.settings import Settings, slices
from service.settings.slices import RAY_PORTS

ROOT = Path(__file__).resolve().parents[3]
COMPOSITION_ROOTS = {"service/api/app.py", "service/server.py", "service/reference.py"}
WHOLE = re.compile(r"(?<!\w)Settings\b")  # Settings (or settings.Settings), not PolicySettings


def _sources() -> list[Path]:
    return sorted(
        p
        for p in (ROOT / "service").rglob("*.py")
        if "versions" not in p.parts
        and p.relative_to(ROOT).as_posix() not in COMPOSITION_ROOTS
        and p.relative_to(ROOT / "service").parts[0] != "settings"
    )


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_service_takes_the_whole_settings(path):
    tree = ast.parse(path.read_text())
    imported = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "service.settings"
        for alias in node.names
    ]
    assert "Settings" not in imported, f"{path.name}: take a slice (service.settings.slices)"
    whole = [
        f"{node.name}({arg.arg})"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]
        if arg.annotation is not None and WHOLE.search(ast.unparse(arg.annotation))
    ]
    assert whole == [], f"{path.name}: {', '.join(whole)} take Settings whole"


# (callable, parameter, the slice it takes)
SERVICES = [
    (access_policy.AccessPolicy.__init__, "settings", slices.PolicySettings),
    (submission_module.Submission.__init__, "settings", slices.SubmissionSettings),
    (reconciler.Reconciler.__init__, "settings", slices.ReconcilerSettings),
    (queue_view.ClusterView.__init__, "quotas", slices.QuotaSettings),
    (queue_view.admission, "quotas", slices.QuotaSettings),
    (scheduler.policy_of, "quotas", slices.QuotaSettings),
    (scheduler.max_queued_jobs, "quotas", slices.QuotaSettings),
    (ray_dashboard.token_source, "ray", slices.RaySettings),
    (ray_dashboard.token_hint, "ray", slices.RaySettings),
    (server.describe_ray, "ray", slices.RaySettings),
    (server.ray_token_line, "ray", slices.RaySettings),
    (factory.build_backend, "ray", slices.RaySettings),
    (factory.build_kuberay_backend, "kuberay", slices.KubeRaySettings),
    (factory.with_standby, "standby", slices.StandbySettings),
    (factory.embedded_ports, "embedded", slices.EmbeddedRaySettings),
]


@pytest.mark.parametrize(
    ("fn", "param", "slice_type"), SERVICES, ids=lambda v: getattr(v, "__qualname__", str(v))
)
def test_each_service_is_typed_with_its_slice(fn, param, slice_type):
    assert param in inspect.signature(fn).parameters
    hints = typing.get_type_hints(fn, localns=vars(slices))
    assert hints[param] is slice_type


def test_the_composition_root_builds_every_slice_from_the_flat_settings(tmp_path):
    s = Settings(
        data_dir=tmp_path,
        backend="kuberay",
        k8s_namespace="ml",
        policy_shared_data_roots=[Path("/datasets")],
        max_queued_jobs_per_tenant=7,
        probe_workers=3,
        standby_drivers=2,
        reconcile_interval_s=2.5,
        max_body_bytes=4096,
        ray_gcs_port=6400,
    )
    assert s.policy.data_dir == tmp_path and s.policy.shared_data_roots == (Path("/datasets"),)
    assert s.submission.quotas.max_queued_jobs == 7 and s.submission.probes.workers == 3
    assert s.reconciler.interval_s == 2.5 and not s.reconciler.storage_keys_in_env
    assert s.ray.kuberay.namespace == "ml" and s.ray.standby.drivers == 2
    assert s.ray.embedded.ports["gcs"] == 6400 and s.api.max_body_bytes == 4096
    assert Settings(data_dir=tmp_path).reconciler.storage_keys_in_env  # ray-jobs
    for value in (s.policy, s.submission, s.reconciler, s.ray, s.api):
        assert dataclasses.is_dataclass(value)


def test_the_embedded_port_map_covers_every_port_setting_and_every_ray_port():
    assert set(RAY_PORTS) == {f.name for f in dataclasses.fields(RayPorts)}
    port_settings = {
        f for f in Settings.model_fields if f.startswith("ray_") and f.endswith("_port")
    }
    assert set(RAY_PORTS.values()) == port_settings
