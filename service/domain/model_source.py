"""``model.hf`` at submit and plan: read its ``config.json``, refuse what cannot train.

After the access policy allowed the folder (:mod:`service.domain.access_policy`
applies the ``data.path`` rules to ``model.hf`` and ``model.tokenizer``), the
service reads the folder's ``config.json`` (at most
``workers.models.hf_config.MAX_CONFIG_BYTES``), maps it with the same
``config_from_hf`` the workers use, and checks the job's layout against it with
the same ``check_layout``. Every problem is a 422 naming ``model.hf`` and the
fix: no folder, no ``config.json``, no safetensors weights, an architecture
etrain cannot train (the message lists the supported ones), a layout that does
not fit (tp must divide the heads, ...). The resolved shape goes to the planner.

Files are opened beneath the tenant's folders (:mod:`workers.storage.confine`: no
link out, regular files only, reads bounded), so a FIFO named config.json cannot stall
a request and a link cannot show another tenant's config; a sharded model's weight map
must name files inside the folder.
A folder in an object store (``s3://`` / ``gs://``, reached with the
spec's ``stores.s3`` / ``stores.gcs`` options and the credentials its
workers will get) is read in :class:`~service.domain.storage_check.StorageProbes`'
threads, with their timeouts and per-tenant bounds, never on the event loop:
its config.json (bounded) and whether its weights exist. A store that cannot be
read is a 422 saying why (no bucket, refused credentials, no permission, no
answer). Torch-free.
"""

from __future__ import annotations

import os

from service.domain.image_check import diffusion_shape_of
from service.domain.storage_check import StorageProbes
from service.errors import InvalidSpec
from workers.models.config import ModelConfig, get_model_config
from workers.models.diffusers_folder import DiffusionShape
from workers.models.hf_config import (
    MAX_CONFIG_BYTES,
    check_layout,
    config_from_hf,
    read_hf_config_text,
)
from workers.models.hf_index import INDEX, MAX_INDEX_BYTES, SINGLE, weight_map
from workers.spec import JobSpec
from workers.spec.objective import reference_vocabulary_error
from workers.storage.confine import (
    UNCONFINED,
    ConfinementError,
    Roots,
    is_file,
    open_fd,
    read_bounded,
)
from workers.storage.location import (
    StorageError,
    StorageLocation,
    is_remote,
    resolve_store,
)
from workers.storage.probe import quick_fs, redact_credentials, store_error_code

WEIGHTS = (SINGLE, INDEX)
LOC = ("model", "hf")


class ModelRefused(ValueError):
    """``model.hf`` cannot be trained as the spec asks; the message says what to change."""


def _folder(uri: str, roots: Roots, field: str = "model.hf") -> str:
    folder = uri.removeprefix("file://")
    try:
        if "://" in folder:
            raise NotADirectoryError(folder)
        os.close(open_fd(folder, roots, directory=True))
    except ConfinementError as e:
        raise ModelRefused(f"{field}: {e}; name a folder inside your data area") from None
    except (FileNotFoundError, NotADirectoryError):
        raise ModelRefused(
            f"{field} {uri} is not a folder the service can see; name a Hugging Face model "
            "folder (config.json + model.safetensors) inside your data area, or an s3:// / "
            "gs:// prefix holding one"
        ) from None
    return folder


def _read_config(folder: str, uri: str, roots: Roots, field: str = "model.hf") -> dict:
    config = f"{folder}/config.json"
    # Opened beneath the tenant's folders, a regular file only (a FIFO cannot stall a
    # request), at most MAX_CONFIG_BYTES read.
    if not is_file(config, roots):
        raise ModelRefused(
            f"{field} {uri} has no config.json; name the folder transformers' save_pretrained "
            "wrote (config.json + model.safetensors)"
        )
    text = read_bounded(config, roots, MAX_CONFIG_BYTES, what=f"{field} config.json")
    return read_hf_config_text(text, where=field)


def _check_index(folder: str, roots: Roots, field: str = "model.hf") -> None:
    """Every file a sharded model's weight map names is a relative name inside the folder,
    and there (as the workers will open it): a 422 now instead of a failed job."""
    raw = read_bounded(f"{folder}/{INDEX}", roots, MAX_INDEX_BYTES, what=f"{field} {INDEX}")
    try:
        files = set(weight_map(raw).values())
    except (ValueError, ConfinementError) as e:
        raise ModelRefused(str(e)) from None
    for name in sorted(files):
        if not is_file(f"{folder}/{name}", roots):
            raise ModelRefused(
                f"{field} {INDEX} weight_map names {name!r}, which is not a file in the folder"
            )


def _explain(loc: StorageLocation, e: Exception) -> str:
    """Why the store of model.hf ``loc`` could not be read, and what to change."""
    code = store_error_code(e)
    at = f" at {loc.endpoint_url}" if loc.endpoint_url else ""
    head = f"model.hf {loc.uri}"
    if code == "NoSuchBucket":
        return f"{head}: bucket {loc.root.split('/', 1)[0]!r} does not exist{at}"
    if isinstance(e, PermissionError) or code in ("AccessDenied", "InvalidAccessKeyId"):
        return (
            f"{head}: the credentials from {loc.credentials_source} may not read it "
            f"({code or 'permission denied'}); grant get and list on that prefix"
        )
    return (
        f"{head}: cannot reach the store{at} ({type(e).__name__}: {e}); check the "
        "address, the stores section's endpoint_url and the network"
    )


def read_remote_model(spec: JobSpec, timeout_s: float) -> tuple[bytes, bool]:
    """(config.json's first bytes, whether safetensors weights exist) of an object-store
    ``model.hf``, read with the job's store options and this process's credentials."""
    uri = spec.model.hf
    try:
        loc = resolve_store(uri, spec.stores)
    except StorageError as e:
        raise ModelRefused(f"model.hf {uri}: {e}") from None
    fs = quick_fs(loc, timeout_s)
    deadline = {"timeout": timeout_s} if getattr(fs, "async_impl", False) else {}
    try:
        try:
            path = loc.join("config.json")
            text = fs.cat_file(path, start=0, end=MAX_CONFIG_BYTES + 1, **deadline)
        except FileNotFoundError as e:
            if store_error_code(e) == "NoSuchBucket":
                raise
            raise ModelRefused(
                f"model.hf {uri} has no config.json; name the prefix transformers' "
                "save_pretrained wrote (config.json + model.safetensors)"
            ) from None
        weights = any(fs.isfile(loc.join(name), **deadline) for name in WEIGHTS)
    except ModelRefused:
        raise
    except Exception as e:  # noqa: BLE001 - any client error becomes the 422's reason
        raise ModelRefused(redact_credentials(_explain(loc, e), loc)) from None
    return text, weights


def _remote_config(spec: JobSpec, probes: StorageProbes | None, tenant: str) -> tuple[dict, bool]:
    uri = spec.model.hf
    probes = probes or StorageProbes(workers=1, per_tenant=1, timeout_s=10.0)
    try:
        text, weights = probes.call(tenant, lambda t: read_remote_model(spec, t))
    except TimeoutError:
        raise ModelRefused(
            f"model.hf {uri}: the store did not answer within {probes.timeout_s:g} s "
            "(ETRAIN_PROBE_TIMEOUT_S); check the address, endpoint_url and the network"
        ) from None
    return read_hf_config_text(text, where="model.hf"), weights


def _local_config(uri: str, roots: Roots, field: str = "model.hf") -> tuple[dict, bool]:
    folder = _folder(uri, roots, field)
    config = _read_config(folder, uri, roots, field)
    if is_file(f"{folder}/{WEIGHTS[1]}", roots):
        _check_index(folder, roots, field)
        return config, True
    return config, is_file(f"{folder}/{WEIGHTS[0]}", roots)


def model_config_of(
    spec: JobSpec,
    *,
    probes: StorageProbes | None = None,
    tenant: str = "",
    roots: Roots = UNCONFINED,
) -> ModelConfig | DiffusionShape | None:
    """The shape of ``spec``'s ``model.hf`` checked against its layout (None for a preset;
    of objective diffusion's folder, its :class:`DiffusionShape`, None when not visible).

    An object-store folder is read through ``probes`` (bounds per ``tenant``); a local one
    beneath ``roots`` (the tenant's, :meth:`AccessPolicy.roots`).
    :class:`ModelRefused` names model.hf and the fix for any problem.
    """
    uri = spec.model.hf
    if uri is None:
        return None
    if spec.objective == "diffusion":  # a diffusers folder, not a decoder's config.json
        try:
            return diffusion_shape_of(spec, roots)
        except ValueError as e:
            raise ModelRefused(str(e)) from None
    try:
        if is_remote(uri):
            hf, weights = _remote_config(spec, probes, tenant)
        else:
            hf, weights = _local_config(uri, roots)
        cfg = config_from_hf(hf, where="model.hf")
    except (OSError, ValueError) as e:
        raise ModelRefused(str(e) if isinstance(e, ValueError) else f"model.hf {uri}: {e}") from e
    if not weights:
        raise ModelRefused(
            f"model.hf {uri} has no weights: etrain reads {WEIGHTS[0]} or a sharded "
            f"{WEIGHTS[1]}; save the model with safe_serialization (the default)"
        )
    par = spec.parallelism
    stages = par.pp * (2 if par.pipeline.schedule == "interleaved_1f1b" else 1)
    name = os.path.basename(uri.rstrip("/")) or uri
    try:
        check_layout(
            cfg, tp=par.tp, stages=stages if par.pp > 1 else 1, seq_len=spec.data.seq_len,
            where=f"model.hf ({name})",
        )  # fmt: skip
    except ValueError as e:
        raise ModelRefused(str(e)) from e
    return cfg


def check_model(
    spec: JobSpec,
    *,
    loc: tuple = ("body",),
    probes: StorageProbes | None = None,
    tenant: str = "",
    roots: Roots = UNCONFINED,
) -> ModelConfig | None:
    """:func:`model_config_of` as a 422 (InvalidSpec) whose loc is ``model.hf``."""
    try:
        return model_config_of(spec, probes=probes, tenant=tenant, roots=roots)
    except ModelRefused as e:
        raise InvalidSpec(
            "the job's model cannot be trained",
            [{"loc": [*loc, *LOC], "msg": str(e), "type": "model"}],
        ) from e


def check_reference(
    spec: JobSpec, cfg: ModelConfig | None, *, loc: tuple = ("body",), roots: Roots = UNCONFINED
) -> None:
    """A 422 (loc ``dpo.reference``) when a local ``dpo.reference`` folder cannot be the
    reference of ``spec``'s model (shape ``cfg``; None: its preset): no folder, no
    config.json or weights, an architecture etrain cannot build, another vocabulary. An
    object-store folder is read, and checked the same way, where the workers load it."""
    folder = spec.dpo.reference_folder if spec.dpo is not None else None
    if folder is None or is_remote(folder):
        return
    field = "dpo.reference"
    try:
        hf, weights = _local_config(folder, roots, field)
        ref = config_from_hf(hf, where=field)
        if not weights:
            raise ModelRefused(f"{field} {folder} has no weights ({' or '.join(WEIGHTS)})")
        vocab = (cfg or get_model_config(spec.model.preset)).vocab_size
        error = reference_vocabulary_error(ref.vocab_size, vocab, folder)
        if error:
            raise ModelRefused(error)
    except (OSError, ValueError) as e:
        msg = str(e) if isinstance(e, ValueError) else f"{field} {folder}: {e}"
        raise InvalidSpec(
            "the job's reference model cannot be used",
            [{"loc": [*loc, "dpo", "reference"], "msg": msg, "type": "model"}],
        ) from e
