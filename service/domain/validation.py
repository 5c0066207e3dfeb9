"""Validation of what clients send, with pydantic's errors as 422 items that say what to change."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from service.errors import InvalidSpec
from workers.spec import JobSpec


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside a field annotation (through Union and Annotated), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_in(a)) is not None), None)


def _accepted_fields(root: type[BaseModel], loc: tuple) -> list[str] | None:
    """Names accepted where the unknown field at ``loc`` was given, or None if unknown."""
    model: Any = root
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            continue  # a union tag or list index: the same model goes on
        model = _model_in(field.annotation)
        if model is None:
            return None
    return sorted(f.alias or name for name, f in model.model_fields.items())


def field_errors(
    e: ValidationError, prefix: list, *, root: type[BaseModel] = JobSpec
) -> list[dict]:
    """pydantic's errors of validating ``root`` as 422 items (loc, msg, type); an unknown
    field's item also lists the fields accepted there."""
    items = []
    for err in e.errors(include_url=False, include_input=False):
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and (names := _accepted_fields(root, err["loc"])):
            msg = f"unknown field {err['loc'][-1]!r}; accepted fields: {', '.join(names)}"
        items.append({"loc": [*prefix, *err["loc"]], "msg": msg, "type": err["type"]})
    return items


def validate_spec(data: Any) -> JobSpec:
    """Validate a spec mapping; InvalidSpec carries pydantic's field errors."""
    if not isinstance(data, dict):
        raise InvalidSpec(
            "the job spec must be a mapping",
            [{"loc": ["body"], "msg": "expected a JSON/YAML object", "type": "type"}],
        )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise InvalidSpec("invalid job spec", field_errors(e, ["body"])) from e
