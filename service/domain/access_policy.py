"""What a job spec may touch: the operator's access policy, applied at submit and plan.

Every field of a spec that names a place is checked here against the ``ETRAIN_POLICY_*``
settings, for the tenant that sends it:

- ``checkpoint.storage`` ``file://``: inside the tenant's checkpoint area,
  ``<policy_checkpoint_root>/<tenant>`` (its default storage). ``data.path`` and
  ``data.eval.path`` (the evaluation source, held to exactly the same rules): inside
  its data area, ``<policy_data_root>/<tenant>``, or a shared data root. All are
  resolved first (``..`` and symlinks, as the service sees the file system). Admin
  tokens may also name places under ``policy_admin_roots``. Refused for everyone: the
  service's data dir (database, admin and Ray tokens), other tenants' areas and the
  system folders (``/etc``, ``/proc``, ...). ``model.hf``, ``model.tokenizer`` and a
  ``dpo.reference`` folder follow the ``data.path`` rule. All of them may instead name
  ``s3://`` / ``gs://`` objects under the object-store prefixes below (on ``s3://`` only
  with the job's own secret, else only for tenants allowed the service's keys). Each
  path's scheme selects its store options: ``stores.s3`` for ``s3://``, ``stores.gcs``
  for ``gs://``.
- ``checkpoint.storage`` ``s3://`` / ``gs://``: only prefixes the operator lists for the
  tenant (``policy_object_stores``).
- ``stores.s3.endpoint_url`` / ``stores.gcs.endpoint_url``: only endpoints the
  operator lists (``policy_endpoints``), so the service's probe and the job's workers
  send requests only where the operator allows.
- ``stores.s3.credentials_secret``: only the tenant's own names (by default, the
  secret named after the tenant); without one, a job with an ``s3://`` path would run
  with the service's own keys, which only tenants in ``policy_ambient_credentials`` may.
- ``metrics.mlflow`` / ``metrics.wandb``: ``credentials_secret`` only the tenant's own
  names, as for ``stores.s3``; ``metrics.mlflow.tracking_uri`` only servers the operator
  lists for the tenant (``policy_tracking_uris``; unset = any http(s) server), or a
  ``file:`` store inside the tenant's checkpoint area (the spec refuses other schemes and
  URIs with credentials).

What holds is the check at use: :meth:`AccessPolicy.roots` gives the folders a tenant's
job may open, and every local open (the service's at submit, the workers' at run time)
goes through :mod:`workers.storage.confine`, component by component, beneath them.
A job restores from its own ``checkpoint.storage`` only, so what a restore reads
(DCP's pickled ``.metadata`` included) comes from a place this policy allowed.
Each refusal is one 422 item whose loc names the field and whose msg names the rule
and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from service.domain.nvme_policy import nvme_area, nvme_refusals
from service.errors import InvalidSpec
from service.settings.slices import PolicySettings
from workers.spec import JobSpec
from workers.spec.base import field_loc
from workers.storage.confine import Roots
from workers.storage.location import is_remote

# The fields naming data files or objects, held to the same rule.


def _under_any(place: str, prefixes: list[str]) -> bool:
    """Whether ``place`` is one of ``prefixes`` or lies beneath one (a whole path segment)."""
    return any(place == p or place.startswith(p + "/") for p in prefixes)


def template_files(spec: JobSpec) -> dict[str, str]:
    """The chat template files a spec names (data.chat_template, data.eval.chat_template
    given as absolute paths): field -> path. They follow the data file rule."""
    return {
        f"{d.section}.chat_template": d.chat_template
        for d in spec.data.sections()
        if d.chat_template is not None and d.chat_template.startswith("/")
    }


# Never named by any spec, admin's included.
SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/root", "/run", "/var/run")
SETTINGS_DOC = "docs/settings.md"


@dataclass(frozen=True)
class Tenant:
    """Who a spec is checked for: the tenant's name and whether the caller is an admin."""

    name: str
    admin: bool = False


def _inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _real(path: str | Path) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


class AccessPolicy:
    """The operator's rules for the places a spec may name (see the module docstring)."""

    def __init__(self, settings: PolicySettings):
        """Roots and lists from ``settings`` (``ETRAIN_POLICY_*``)."""
        self.settings = settings
        data = settings.data_dir
        self.checkpoint_root = Path(settings.checkpoint_root or data / "checkpoints")
        self.data_root = Path(settings.data_root or data / "tenants")

    def checkpoint_area(self, tenant: Tenant) -> Path:
        """The folder a tenant's ``file://`` checkpoints live in."""
        return self.checkpoint_root.expanduser() / tenant.name

    def data_area(self, tenant: Tenant) -> Path:
        """The folder a tenant's data files live in."""
        return self.data_root.expanduser() / tenant.name

    def roots(self, tenant: Tenant) -> Roots:
        """The folders ``tenant``'s jobs may open, for the check at the moment of use: read
        beneath its data area, the shared data roots and its checkpoint area; write beneath
        its checkpoint area and NVMe swap area; an admin also beneath ``policy_admin_roots``.
        The service opens a spec's files beneath them at submit and plan, and writes them
        into each job's environment (``ETRAIN_STORAGE_ROOTS``), where the workers read them."""
        admin = list(self.settings.admin_roots) if tenant.admin else []
        read = [self.data_area(tenant), *self.settings.shared_data_roots, *admin]
        nvme = [a for a in [nvme_area(self.settings, tenant.name)] if a]
        return Roots.of(read, [self.checkpoint_area(tenant), *nvme, *admin])

    def default_storage(self, tenant: Tenant) -> str:
        """``checkpoint.storage`` for a spec that names none: the tenant's checkpoint area."""
        return f"file://{self.checkpoint_area(tenant)}"

    def check(self, tenant: Tenant, spec: JobSpec, *, loc: tuple = ("body",)) -> None:
        """Raise InvalidSpec (422) listing every field of ``spec`` the policy refuses."""
        errors = []
        for field, msg in self.refusals(tenant, spec):
            errors.append({"loc": [*loc, *field], "msg": msg, "type": "policy"})
        if errors:
            raise InvalidSpec("the job spec names places its tenant may not use", errors)

    def refusals(self, tenant: Tenant, spec: JobSpec) -> list[tuple[tuple, str]]:
        """(field path, why and what to do) for each field the policy refuses."""
        out: list[tuple[tuple, str]] = []
        for data in spec.data.sections():
            field = f"{data.section}.path"
            if data.path is not None:
                why = self._data_refusal(tenant, spec, data.path, field=field)
                if why:
                    out.append((field_loc(field), why))
        for field, path in template_files(spec).items():
            why = self._file_refusal(tenant, path, field=field, data=True)
            if why:
                out.append((field_loc(field), why))
        for loc, place in spec.model_folders().items():
            field = ".".join(loc)
            why = self._model_refusal(tenant, place, field=field) or self._service_keys_refusal(
                tenant, spec, place, field=field
            )
            if why:
                out.append((loc, why))
        ck = spec.checkpoint
        storage = ck.storage or ""
        if storage.startswith("file://"):
            why = self._file_refusal(
                tenant, storage.removeprefix("file://"), field="checkpoint.storage", data=False
            )
            if why:
                out.append((("checkpoint", "storage"), why))
        elif storage:
            out.extend(self._object_store_refusals(tenant, spec))
        out.extend(self._store_option_refusals(tenant, spec))
        out.extend(self._tracking_refusals(tenant, spec))
        return out + nvme_refusals(self.settings, spec)

    # -- files ------------------------------------------------------------------------------

    def _forbidden(self) -> list[tuple[str, str]]:
        """(resolved root, what it is) of the places no spec may name."""
        places = [(d, f"{d} (a system folder)") for d in SYSTEM_DIRS]
        # Most specific first: the tenant areas usually lie inside the data dir.
        places += [
            (str(self.checkpoint_root), "another tenant's checkpoint area"),
            (str(self.data_root), "another tenant's data area"),
            (str(self.settings.data_dir), "the service's data dir"),
        ]
        return [(_real(p), what) for p, what in places]

    def _file_refusal(self, tenant: Tenant, path: str, *, field: str, data: bool) -> str | None:
        """Why ``path`` may not be used as ``field`` by ``tenant``; None when it may."""
        area = self.data_area(tenant) if data else self.checkpoint_area(tenant)
        own = _real(area)
        fix = f"use a path inside {area} (ETRAIN_POLICY_{'DATA' if data else 'CHECKPOINT'}_ROOT)"
        if not path.startswith("/"):
            return f"{field} must be an absolute path; {fix}"
        real = _real(path)
        if _inside(real, own):
            return None
        forbidden = self._forbidden()
        inside = [what for root, what in forbidden if _inside(real, root)]
        # A storage folder holding one of them would put the job's files among them.
        holds = [what for root, what in forbidden if not data and _inside(root, real)]
        if inside or holds:
            where = f"is inside {inside[0]}" if inside else f"contains {holds[0]}"
            return f"{field} {path} {where}, which no job may use; {fix}"
        extra = list(self.settings.shared_data_roots) if data else []
        if tenant.admin:
            extra += self.settings.admin_roots
        if any(_inside(real, _real(root)) for root in extra):
            return None
        return f"{field} {path} is outside tenant {tenant.name!r}'s area (resolved: {real}); {fix}"

    def _data_refusal(self, tenant: Tenant, spec: JobSpec, path: str, *, field: str) -> str | None:
        """Why ``path`` may not be ``field`` (data.path, data.eval.path): an absolute path
        follows the file rule, an ``s3://`` / ``gs://`` object the object-store prefixes
        (like model.hf) and :meth:`_service_keys_refusal`."""
        if not is_remote(path):
            return self._file_refusal(tenant, path, field=field, data=True)
        return self._model_refusal(tenant, path, field=field) or self._service_keys_refusal(
            tenant, spec, path, field=field
        )

    def _service_keys_refusal(
        self, tenant: Tenant, spec: JobSpec, place: str | None, *, field: str
    ) -> str | None:
        """Why an ``s3://`` ``place`` (data.path, data.eval.path, model.hf, model.tokenizer)
        may not be read: without the job's own secret (``stores.s3.credentials_secret``) the
        service and the workers would read it with the service's keys, which only some
        tenants may use."""
        if not (place or "").startswith("s3://"):
            return None
        if spec.stores.s3 is not None and spec.stores.s3.credentials_secret:
            return None  # the secret is checked by _secret_refusals
        if (spec.checkpoint.storage or "").startswith("s3://"):
            return None  # an s3:// checkpoint.storage is refused without a secret there
        if tenant.name in self.settings.ambient_credentials or (
            tenant.admin and self.settings.admin_any_store
        ):
            return None
        return (
            f"{field} {place} on s3:// would be read with the service's own keys, which "
            f"tenant {tenant.name!r} may not use (ETRAIN_POLICY_AMBIENT_CREDENTIALS); set "
            "stores.s3.credentials_secret to one of your secrets (the job reads every "
            "s3:// path with it)"
        )

    def _model_refusal(self, tenant: Tenant, place: str | None, *, field: str) -> str | None:
        """Why ``place`` may not be ``field`` (model.hf, model.tokenizer); None when it may.

        Untrusted like data.path: a local folder in the tenant's data area or a shared
        data root (``file://`` or a plain absolute path); an object store only under a
        prefix the operator lists for the tenant.
        """
        if place is None:
            return None
        if is_remote(place):
            if tenant.admin and self.settings.admin_any_store:
                return None
            prefixes = [p.rstrip("/") for p in self._listed(self.settings.object_stores, tenant)]
            if _under_any(place, prefixes):
                return None
            return (
                f"{field} {place} is not in an object-store prefix tenant {tenant.name!r} may "
                f"use (allowed: {', '.join(prefixes) or 'none'}); use a folder inside "
                f"{self.data_area(tenant)} or ask the operator to list the prefix in "
                "ETRAIN_POLICY_OBJECT_STORES"
            )
        if "://" in place.removeprefix("file://"):
            return f"{field} {place}: use an absolute path, file://, s3:// or gs://"
        return self._file_refusal(tenant, place.removeprefix("file://"), field=field, data=True)

    # -- object stores ----------------------------------------------------------------------

    def _listed(self, mapping: Mapping[str, list[str]], tenant: Tenant) -> list[str]:
        """The entries of ``mapping`` for ``tenant`` and for every tenant (``*``)."""
        values = [*mapping.get(tenant.name, []), *mapping.get("*", [])]
        return [v.replace("{tenant}", tenant.name) for v in values]

    def allowed_secrets(self, tenant: Tenant) -> list[str]:
        """The ``credentials_secret`` names ``tenant`` may use."""
        mapping = self.settings.secrets
        own = mapping.get(tenant.name, [tenant.name])
        names = [*own, *mapping.get("*", [])]
        return list(dict.fromkeys(v.replace("{tenant}", tenant.name) for v in names))

    def _object_store_refusals(self, tenant: Tenant, spec: JobSpec) -> list[tuple[tuple, str]]:
        ck = spec.checkpoint
        storage = ck.storage or ""
        if tenant.admin and self.settings.admin_any_store:
            return []
        out = []
        prefixes = [p.rstrip("/") for p in self._listed(self.settings.object_stores, tenant)]
        if not _under_any(storage, prefixes):
            allowed = ", ".join(prefixes) or "none"
            why = (
                f"checkpoint.storage {storage} is not an object-store prefix tenant "
                f"{tenant.name!r} may use (allowed: {allowed}); use one of them, or a "
                f"file:// path inside {self.checkpoint_area(tenant)}, or ask the operator "
                "to list it in ETRAIN_POLICY_OBJECT_STORES"
            )
            out.append((("checkpoint", "storage"), why))
        return out

    def _store_option_refusals(self, tenant: Tenant, spec: JobSpec) -> list[tuple[tuple, str]]:
        """The ``stores`` options the policy refuses: endpoints the operator does not list,
        and a credentials secret that is not the tenant's (or missing, for an ``s3://``
        checkpoint.storage of a tenant that may not use the service's keys)."""
        if tenant.admin and self.settings.admin_any_store:
            return []
        out = []
        endpoints = {e.rstrip("/") for e in self._listed(self.settings.endpoints, tenant)}
        for section in ("s3", "gcs"):
            endpoint = getattr(getattr(spec.stores, section), "endpoint_url", None)
            if endpoint is not None and endpoint.rstrip("/") not in endpoints:
                out.append(
                    (
                        ("stores", section, "endpoint_url"),
                        f"stores.{section}.endpoint_url is not an endpoint the operator "
                        f"allows for tenant {tenant.name!r} (allowed: "
                        f"{', '.join(sorted(endpoints)) or 'none'}); remove it or use one of "
                        "them (ETRAIN_POLICY_ENDPOINTS)",
                    )
                )
        s3 = spec.stores.s3
        if (spec.checkpoint.storage or "").startswith("s3://") or (s3 and s3.credentials_secret):
            out.extend(self._secret_refusals(tenant, spec))
        return out

    def _secret_refusals(self, tenant: Tenant, spec: JobSpec) -> list[tuple[tuple, str]]:
        s3 = spec.stores.s3
        secret = s3.credentials_secret if s3 is not None else None
        allowed = self.allowed_secrets(tenant)
        loc = ("stores", "s3", "credentials_secret")
        if secret is None:
            if tenant.name in self.settings.ambient_credentials:
                return []
            return [
                (
                    loc,
                    "stores.s3.credentials_secret is required: without it the job would run "
                    f"with the service's own keys, which tenant {tenant.name!r} may not use "
                    f"(ETRAIN_POLICY_AMBIENT_CREDENTIALS); set it to one of: {', '.join(allowed)}",
                )
            ]
        if secret not in allowed:
            return [
                (
                    loc,
                    f"stores.s3.credentials_secret {secret!r} is not a secret tenant "
                    f"{tenant.name!r} may use; use one of: {', '.join(allowed)} "
                    "(ETRAIN_POLICY_SECRETS)",
                )
            ]
        return []

    # -- experiment trackers -----------------------------------------------------------------

    def _tracking_refusals(self, tenant: Tenant, spec: JobSpec) -> list[tuple[tuple, str]]:
        """``metrics.mlflow`` / ``metrics.wandb``: a credentials secret that is not the
        tenant's, an MLflow server the operator does not list (when it lists any), a
        ``file:`` store outside the tenant's checkpoint area."""
        out = []
        mlflow = spec.metrics.mlflow
        if mlflow is not None and mlflow.tracking_uri.startswith("file:"):
            path = urlsplit(mlflow.tracking_uri).path
            why = self._file_refusal(tenant, path, field="metrics.mlflow.tracking_uri", data=False)
            if why:
                out.append((("metrics", "mlflow", "tracking_uri"), why))
        if tenant.admin and self.settings.admin_any_store:
            return out
        if mlflow is not None and not mlflow.tracking_uri.startswith("file:"):
            why = self._tracking_uri_refusal(tenant, mlflow.tracking_uri)
            if why:
                out.append((("metrics", "mlflow", "tracking_uri"), why))
        allowed = self.allowed_secrets(tenant)
        for name in ("mlflow", "wandb"):
            secret = getattr(getattr(spec.metrics, name), "credentials_secret", None)
            if secret is not None and secret not in allowed:
                out.append(
                    (
                        ("metrics", name, "credentials_secret"),
                        f"metrics.{name}.credentials_secret {secret!r} is not a secret tenant "
                        f"{tenant.name!r} may use; use one of: {', '.join(allowed)} "
                        "(ETRAIN_POLICY_SECRETS)",
                    )
                )
        return out

    def _tracking_uri_refusal(self, tenant: Tenant, uri: str) -> str | None:
        """Why the MLflow server ``uri`` may not be used: the operator lists servers
        (``policy_tracking_uris``) and none of the tenant's holds it."""
        if not self.settings.tracking_uris:
            return None
        listed = [u.rstrip("/") for u in self._listed(self.settings.tracking_uris, tenant)]
        if _under_any(uri, listed):
            return None
        return (
            f"metrics.mlflow.tracking_uri {uri} is not a tracking server tenant "
            f"{tenant.name!r} may use (allowed: {', '.join(listed) or 'none'}); use one of them "
            "(ETRAIN_POLICY_TRACKING_URIS) or a file: folder inside "
            f"{self.checkpoint_area(tenant)}"
        )
