"""A CustomObjectsApi that keeps objects in memory and validates what is created."""

from __future__ import annotations

import copy

from kubernetes.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from service.k8s.validate import validate_objects


class FakeCustomObjectsApi(CustomObjectsApi):
    """The real interface; objects live in a dict keyed by (plural, namespace, name).

    Every created object goes through the same validators as the manifests
    (CRD schema strict, KubeRay operator checks), as the API server and the
    operator would refuse it otherwise.
    """

    def __init__(self):
        super().__init__(ApiClient(Configuration()))
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple] = []
        self.fail_with: Exception | None = None

    def _check(self, *call) -> None:
        self.calls.append(call)
        if self.fail_with is not None:
            raise self.fail_with

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **kw):
        self._check("create", plural, namespace, body["metadata"]["name"])
        assert (group, version) == ("ray.io", "v1")
        validate_objects([body])
        key = (plural, namespace, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[key] = copy.deepcopy(body)
        return body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **kw):
        self._check("get", plural, namespace, name)
        try:
            return copy.deepcopy(self.objects[(plural, namespace, name)])
        except KeyError:
            raise ApiException(status=404, reason="NotFound") from None

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, **kw):
        self._check("delete", plural, namespace, name)
        if self.objects.pop((plural, namespace, name), None) is None:
            raise ApiException(status=404, reason="NotFound")
        return {"status": "Success"}

    def list_namespaced_custom_object(self, group, version, namespace, plural, **kw):
        self._check("list", plural, namespace)
        items = [o for (p, ns, _), o in self.objects.items() if (p, ns) == (plural, namespace)]
        return {"items": copy.deepcopy(items[: kw.get("limit") or None])}

    def set_status(self, plural: str, namespace: str, name: str, status: dict) -> None:
        """What the operator would write to ``.status``."""
        self.objects[(plural, namespace, name)]["status"] = status
