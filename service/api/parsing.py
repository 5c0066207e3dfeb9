"""Request bodies: JSON, or YAML by Content-Type, decoded before any domain code sees them."""

from __future__ import annotations

import json
from typing import Any

import yaml

from service.errors import InvalidSpec

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


def parse_body(raw: bytes, content_type: str | None) -> Any:
    """Decode a JSON or YAML request body, or raise InvalidSpec saying where it broke."""
    ct = (content_type or "application/json").split(";")[0].strip().lower()
    try:
        if ct in YAML_TYPES:
            return yaml.safe_load(raw.decode("utf-8"))
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise InvalidSpec(
            f"request body is not valid {ct}: {e}",
            [{"loc": ["body"], "msg": f"malformed {ct}: {e}", "type": "parse_error"}],
        ) from e
