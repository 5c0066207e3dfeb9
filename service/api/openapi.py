"""The OpenAPI document: FastAPI's, plus the schemas of the bodies routes decode themselves.

Routes that accept YAML as well as JSON read their body themselves, so FastAPI
does not see its model; :func:`body` documents it by reference and
:func:`document_bodies` adds the referenced schemas to the document's components.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI
from pydantic import BaseModel

REF = "#/components/schemas/{model}"


def ref(model: type[BaseModel]) -> dict:
    """A JSON schema reference to ``model``'s component."""
    return {"$ref": REF.format(model=model.__name__)}


def body(schema: dict, *, yaml: bool = True) -> dict:
    """``openapi_extra`` of a route whose required body is JSON of ``schema`` (or YAML)."""
    content = {"application/json": {"schema": schema}}
    if yaml:
        content["application/yaml"] = {
            "schema": {"type": "string", "description": "The same object as YAML."}
        }
    return {"requestBody": {"required": True, "content": content}}


ERROR = {
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"$ref": REF.format(model="ValidationError")}},
            ],
            "description": "What was wrong and what to send instead; a list of field "
            "errors (loc, msg, type) for a 422.",
        }
    },
    "title": "Error",
}
# The errors each kind of operation can answer, beyond what FastAPI documents itself.
_AUTH_ERRORS = {
    "401": "Missing, unknown or revoked API token.",
    "403": "The token may not call this route (a job's reporter token, or not an admin).",
}
_BODY_ERRORS = {
    "413": "The body is larger than ETRAIN_MAX_BODY_BYTES.",
    "415": "The body is not in a media type the route reads (JSON or YAML, UTF-8).",
    "422": "The body is malformed, nests too deep, or names a field wrongly.",
}
_ID_ERRORS = {"404": "No such job or token visible to the caller."}
_PROBES_BUSY = "the tenant has ETRAIN_PROBE_PER_TENANT storage probes in flight."
_QUOTA_ERRORS = {
    ("/v1/jobs", "post"): "The tenant has as many QUEUED jobs as its quota "
    "(ETRAIN_MAX_QUEUED_JOBS_PER_TENANT, or its ETRAIN_TENANT_QUOTAS entry), or " + _PROBES_BUSY,
    ("/v1/plan", "post"): "A tenant quota: " + _PROBES_BUSY,
}


def _error(description: str) -> dict:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
    }


def _document_errors(document: dict) -> None:
    """Add the error answers of every operation (auth, ids, bodies) to ``document``."""
    document["components"]["schemas"].setdefault("Error", ERROR)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            errors: dict[str, str] = {}
            if (path, method) in _QUOTA_ERRORS:
                errors["429"] = _QUOTA_ERRORS[path, method]
            if path.startswith("/v1/"):
                errors |= _AUTH_ERRORS
            elif path == "/metrics":
                errors["401"] = "An Authorization header with an unknown or revoked token."
            if "{" in path:
                errors |= _ID_ERRORS
            if "requestBody" in operation:
                errors |= _BODY_ERRORS
            responses = operation.setdefault("responses", {})
            for code, description in errors.items():
                responses.setdefault(code, _error(description))


def document_bodies(app: FastAPI, models: Iterable[type[BaseModel]]) -> None:
    """Make ``app.openapi()`` carry the schemas of ``models`` and of the models they use,
    and every operation's error answers."""
    models = tuple(models)
    generate = app.openapi

    def openapi() -> dict:
        """FastAPI's document (built once) with the body models' schemas added."""
        if app.openapi_schema is None:
            document = generate()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(by_alias=True, ref_template=REF)
                for name, part in {**schema.pop("$defs", {}), model.__name__: schema}.items():
                    schemas.setdefault(name, part)
            _document_errors(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
