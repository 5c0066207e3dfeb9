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


def document_bodies(app: FastAPI, models: Iterable[type[BaseModel]]) -> None:
    """Make ``app.openapi()`` carry the schemas of ``models`` and of the models they use."""
    models = tuple(models)
    generate = app.openapi

    def openapi() -> dict:
        """FastAPI's document (built once) with the body models' schemas added."""
        if app.openapi_schema is None:
            schemas = generate().setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(by_alias=True, ref_template=REF)
                for name, part in {**schema.pop("$defs", {}), model.__name__: schema}.items():
                    schemas.setdefault(name, part)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
