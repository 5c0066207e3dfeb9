"""Just enough of ``kustomize build`` to validate deploy/ without a kustomize binary.

No kustomize engine installs from PyPI, so the tests load each kustomization the
way kustomize does for the features deploy/ uses: ``resources`` (files and
directories), ``components``, ``patches`` (patch files whose own kind and name
pick the target), ``namespace`` and ``images``. Any other field is refused,
so deploy/ cannot grow a feature these tests would silently skip.

Patches are applied as JSON merge patches (RFC 7386). That is what kustomize
does for custom resources; for built-in kinds it uses strategic merge, which
is identical as long as the patch holds no lists, so list-holding patches of
built-in kinds are refused here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "components", "patches", "namespace", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass"}


class KustomizeError(ValueError):
    """The kustomization uses something this loader does not do, or is inconsistent."""


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _has_list(node) -> bool:
    if isinstance(node, list):
        return True
    return isinstance(node, dict) and any(_has_list(v) for v in node.values())


def _ident(obj: dict) -> tuple:
    meta = obj.get("metadata") or {}
    return obj.get("kind"), meta.get("namespace"), meta.get("name")


def _load_file(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _apply_patch(objects: list[dict], patch: dict, source: Path) -> None:
    kind, name = patch.get("kind"), (patch.get("metadata") or {}).get("name")
    matches = [o for o in objects if o.get("kind") == kind
               and (o.get("metadata") or {}).get("name") == name]
    if len(matches) != 1:
        raise KustomizeError(f"{source}: patch target {kind}/{name} matches {len(matches)} objects")
    if not patch.get("apiVersion", "").startswith("ray.io/") and _has_list(patch.get("spec")):
        raise KustomizeError(f"{source}: strategic-merge list patches are not supported here")
    patched = merge_patch(matches[0], patch)
    objects[objects.index(matches[0])] = patched


def _set_images(node, images: list[dict]) -> None:
    """kustomize's images transformer: every containers/initContainers list, anywhere."""
    if isinstance(node, list):
        for item in node:
            _set_images(item, images)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            for container in value:
                _retag(container, images)
        _set_images(value, images)


def _retag(container: dict, images: list[dict]) -> None:
    name, _, tag = container.get("image", "").partition(":")
    for image in images:
        if image["name"] == name:
            container["image"] = (f"{image.get('newName', name)}:"
                                  f"{image.get('newTag', tag)}").rstrip(":")


def build(directory: Path, *, _component: bool = False) -> list[dict]:
    """The objects ``kustomize build directory`` would print (for the supported fields)."""
    kfile = directory / "kustomization.yaml"
    spec = yaml.safe_load(kfile.read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported fields {sorted(unknown)}")
    if (spec.get("kind") == "Component") != _component:
        raise KustomizeError(f"{kfile}: kind {spec.get('kind')} used as "
                             f"{'a component' if _component else 'a kustomization'}")
    objects: list[dict] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        objects += build(path) if path.is_dir() else _load_file(path)
    for entry in spec.get("components", []):
        objects = _apply_component(objects, directory / entry)
    for entry in spec.get("patches", []):
        if set(entry) != {"path"}:
            raise KustomizeError(f"{kfile}: only `patches: - path:` is supported")
        for patch in _load_file(directory / entry["path"]):
            _apply_patch(objects, patch, directory / entry["path"])
    if spec.get("namespace"):
        for obj in objects:
            if obj.get("kind") not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = spec["namespace"]
    _set_images(objects, spec.get("images", []))
    _check_unique(objects, kfile)
    return objects


def _apply_component(objects: list[dict], directory: Path) -> list[dict]:
    kfile = directory / "kustomization.yaml"
    spec = yaml.safe_load(kfile.read_text())
    if set(spec) - {"apiVersion", "kind", "resources", "patches"}:
        raise KustomizeError(f"{kfile}: unsupported component fields")
    objects = objects + [o for e in spec.get("resources", []) for o in _load_file(directory / e)]
    for entry in spec.get("patches", []):
        for patch in _load_file(directory / entry["path"]):
            _apply_patch(objects, patch, directory / entry["path"])
    return objects


def _check_unique(objects: list[dict], kfile: Path) -> None:
    seen = set()
    for obj in objects:
        ident = _ident(obj)
        if ident in seen:
            raise KustomizeError(f"{kfile}: {ident} is defined twice")
        seen.add(ident)
