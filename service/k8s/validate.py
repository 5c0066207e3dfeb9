"""Validate Kubernetes objects offline, as the API server and the KubeRay operator would.

- ray.io/v1 objects: the KubeRay 1.7.0 CRD ``openAPIV3Schema`` (shipped in
  ``service/k8s/crds``), made strict: an object schema that lists properties
  and does not preserve unknown fields rejects any other key (the API server
  prunes them silently, which hides typos). Their ``metadata`` is checked
  against Kubernetes' ObjectMeta.
- Everything else: Kubernetes' own OpenAPI schemas (``kubernetes-validate``,
  strict) for ``KUBE_VERSION``.
- Then the checks the schemas do not carry: the KubeRay operator's
  (``ray-operator/controllers/ray/utils/validation.go``) and the API server's
  name and label rules.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable
from pathlib import Path

import yaml

from service.errors import EtrainError
from service.k8s.operator_checks import metadata_errors, operator_errors

KUBE_VERSION = "1.30.0"
CRD_DIR = Path(__file__).parent / "crds"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


class ManifestError(EtrainError, ValueError):
    """One or more objects are invalid; ``errors`` holds one line per problem."""

    status_code = 422

    def __init__(self, errors: list[str]):
        super().__init__("invalid manifest:\n  " + "\n  ".join(errors))
        self.errors = errors


def _path(parts: Iterable) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def strict_schema(schema: dict) -> dict:
    """A copy of an openAPIV3 schema that rejects unknown fields.

    ``additionalProperties: false`` goes on every object schema that lists
    ``properties``, has no ``additionalProperties`` and no
    ``x-kubernetes-preserve-unknown-fields``.
    """
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        stack.extend(v for v in node.values() if isinstance(v, dict | list))
    return schema


@functools.cache
def crd_validator(kind: str):
    """A jsonschema validator for ``kind``'s ray.io/v1 schema, strict (cached)."""
    import jsonschema

    if kind not in CRD_FILES:
        raise ManifestError([f"{kind}: no ray.io/v1 schema here (known: {sorted(CRD_FILES)})"])
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(CRD_DIR / CRD_FILES[kind]) as f:
        crd = yaml.load(f, Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = strict_schema(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"$ref": f"{_defs_id()}#/$defs/{_OBJECT_META}"}
    return jsonschema.Draft202012Validator(schema, registry=_k8s_registry())


@functools.cache
def _k8s_definitions() -> dict:
    from kubernetes_validate.utils import schema_contents

    return schema_contents(
        f"kubernetes-json-schema/v{KUBE_VERSION}-local-strict/_definitions.json", KUBE_VERSION
    )


def _defs_id() -> str:
    return _k8s_definitions()["$id"]


def _k8s_registry():
    from referencing import Registry, Resource

    return Resource.from_contents(_k8s_definitions()) @ Registry()


def crd_errors(obj: dict) -> list[str]:
    """Schema errors of a ray.io/v1 object, each naming the field."""
    validator = crd_validator(obj.get("kind", ""))
    found = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_path(e.absolute_path)}: {e.message}" for e in found]


def core_errors(obj: dict, *, kube_version: str = KUBE_VERSION) -> list[str]:
    """Errors of a built-in object against Kubernetes' strict OpenAPI schema."""
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    try:
        kubernetes_validate.validate(obj, kube_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{_path(e.absolute_path)}: {e.message}"]
    except SchemaNotFoundError as e:
        return [e.message]
    return []


def object_errors(obj: dict, *, kube_version: str = KUBE_VERSION) -> list[str]:
    """Every problem with one object, each line prefixed ``Kind/name``."""
    if not isinstance(obj, dict) or "kind" not in obj or "apiVersion" not in obj:
        return ["<object>: not a Kubernetes object (needs apiVersion and kind)"]
    name = f"{obj['kind']}/{(obj.get('metadata') or {}).get('name', '?')}"
    if obj["apiVersion"] == "ray.io/v1":
        errors = crd_errors(obj)
        if not errors:  # the operator's checks assume a well-typed object
            errors = operator_errors(obj)
    else:
        errors = core_errors(obj, kube_version=kube_version)
    errors += metadata_errors(obj)
    return [f"{name}: {e}" for e in errors]


def validate_objects(objects: Iterable[dict], *, kube_version: str = KUBE_VERSION) -> None:
    """Raise ManifestError listing every problem in ``objects``; return when all are valid."""
    errors = [e for obj in objects for e in object_errors(obj, kube_version=kube_version)]
    if errors:
        raise ManifestError(errors)
