"""Request bodies: JSON, or YAML by Content-Type, decoded before any domain code sees them.

Only JSON and YAML media types are read (a ``text/plain`` or form body, the kind a
cross-site request sends without a preflight, is a 415), and a decoded body is
bounded in nesting depth and in the number of values it holds, so neither a
deeply nested document nor a YAML alias bomb reaches the validators: a YAML
document's aliases are measured on its node graph, expanded but memoized, before any
Python object is built. The body's size is bounded before it is read
(``service.api.limits``); YAML, and JSON of 64 KiB or more, is decoded in a worker
thread, so a large body never stalls the event loop and the requests waiting on it.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from yaml import events

from service.errors import EtrainError, InvalidSpec

JSON_TYPE = "application/json"
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
# Deeper than any job spec or telemetry batch; far below Python's recursion limit.
MAX_DEPTH = 64
# Values (scalars, lists and mappings, an alias counted each time it is used) in one body.
MAX_VALUES = 200_000
# libyaml's parser (C, iterative) when PyYAML was built with it: a 1 MiB document takes
# ~0.3 s to refuse instead of ~13 s in pure Python.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (events.SequenceStartEvent, events.MappingStartEvent)
_CLOSE = (events.SequenceEndEvent, events.MappingEndEvent)
# JSON bodies at least this large (and YAML bodies of any size) are decoded in a worker
# thread, off the event loop.
_OFF_LOOP_BYTES = 64 * 1024


class UnsupportedMediaType(EtrainError):
    """A request body in a media type the route does not read."""

    status_code = 415


def _media_type(content_type: str | None, accepted: tuple[str, ...]) -> str:
    """The body's media type if ``accepted`` has it (UTF-8 only), else raise 415."""
    parts = [p.strip().lower() for p in (content_type or "").split(";")]
    media_type, params = parts[0], dict(p.partition("=")[::2] for p in parts[1:] if p)
    charset = params.get("charset", "utf-8").strip('"')
    if media_type in accepted and charset in ("utf-8", "utf8"):
        return media_type
    raise UnsupportedMediaType(
        f"Content-Type {content_type or '(none)'!r} is not accepted here: send "
        f"{' or '.join(accepted)} (UTF-8, charset utf-8 or none)"
    )


def _malformed(media_type: str, why: str) -> InvalidSpec:
    return InvalidSpec(
        f"request body is not valid {media_type}: {why}",
        [{"loc": ["body"], "msg": f"malformed {media_type}: {why}", "type": "parse_error"}],
    )


def _check_shape(data: Any, media_type: str) -> None:
    """Raise 422 when ``data`` nests deeper than MAX_DEPTH or holds over MAX_VALUES values.

    Iterative, and counts a shared (YAML alias) value each time it is reached, so an
    alias bomb stops at MAX_VALUES instead of being expanded.
    """
    stack, seen = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise _malformed(media_type, f"more than {MAX_VALUES} values")
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise _malformed(media_type, f"nested deeper than {MAX_DEPTH} levels")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def _load_yaml(text: str, media_type: str) -> Any:
    """Parse YAML safely and bounded: its events are counted first (depth, values), then
    the composed node graph is measured with every alias expanded (:func:`_check_nodes`),
    and only a document within both bounds is turned into Python objects."""
    try:
        _count_yaml(text, media_type)
    except yaml.YAMLError as e:
        if "nesting depth" not in str(e):  # libyaml's own limit (1000), met while scanning
            raise
        raise _malformed(media_type, f"nested deeper than {MAX_DEPTH} levels") from e
    loader = _YAML_LOADER(text)  # CSafeLoader or SafeLoader: no arbitrary objects
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, media_type)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_nodes(root: yaml.Node, media_type: str) -> None:
    """Raise 422 when the document at ``root``, its aliases expanded, holds more than
    MAX_VALUES values or nests deeper than MAX_DEPTH: each list's and mapping's expanded
    size (1 + its children's, keys included) and height are computed once (memoized), so
    nine levels of nine-fold aliases cost nine sums, not 387 million values. An alias is
    the node it names, so a node that holds itself is an infinite expansion: refused too."""
    size: dict[int, int] = {}
    height: dict[int, int] = {}  # levels of lists and mappings, as _check_shape counts them
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in size or isinstance(node, yaml.ScalarNode):
            continue
        if not children_done:
            if key in height:  # on the current path: the node holds itself through an alias
                raise _malformed(
                    media_type, f"more than {MAX_VALUES} values (an alias refers to itself)"
                )
            height[key] = 0  # marks it as on the path
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node) if id(child) not in size)
            continue
        total, below = 1, 0
        for child in _children(node):
            if isinstance(child, yaml.ScalarNode):
                total += 1
            else:
                total += size[id(child)]
                below = max(below, height[id(child)])
        size[key], height[key] = total, below + 1
        if total > MAX_VALUES:
            raise _malformed(
                media_type, f"more than {MAX_VALUES} values once its aliases are expanded"
            )
        if below + 1 > MAX_DEPTH:
            raise _malformed(media_type, f"nested deeper than {MAX_DEPTH} levels")


def _children(node: yaml.Node):
    """The nodes inside a list (its items) or a mapping (its keys and values)."""
    if isinstance(node, yaml.MappingNode):
        return (part for pair in node.value for part in pair)
    return node.value


def _count_yaml(text: str, media_type: str) -> None:
    """Raise 422 at the first YAML event past MAX_DEPTH or MAX_VALUES."""
    depth = values = 0
    for event in yaml.parse(text, Loader=_YAML_LOADER):
        if isinstance(event, _OPEN):
            depth += 1
            if depth > MAX_DEPTH:
                raise _malformed(media_type, f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, _CLOSE):
            depth -= 1
        values += isinstance(event, (*_OPEN, events.ScalarEvent, events.AliasEvent))
        if values > MAX_VALUES:
            raise _malformed(media_type, f"more than {MAX_VALUES} values")


def _finite(text: str) -> float:
    """A JSON number as a float; one that overflows to infinity is malformed."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _is_yaml(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() in YAML_TYPES


def parse_body(raw: bytes, content_type: str | None, *, yaml_ok: bool = True) -> Any:
    """Decode a JSON (or, with ``yaml_ok``, YAML) request body, or raise 415 / 422."""
    media_type = _media_type(content_type, (JSON_TYPE, *YAML_TYPES) if yaml_ok else (JSON_TYPE,))
    try:
        if media_type in YAML_TYPES:
            data = _load_yaml(raw.decode("utf-8"), media_type)
        else:
            data = json.loads(raw.decode("utf-8"), parse_float=_finite, parse_constant=_no_constant)
    except RecursionError as e:
        raise _malformed(media_type, f"nested deeper than {MAX_DEPTH} levels") from e
    except (ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError is a ValueError
        raise _malformed(media_type, str(e)) from e
    _check_shape(data, media_type)
    return data


async def read_body(request: Request, *, yaml_ok: bool = True) -> Any:
    """Read and decode ``request``'s body (call it after authentication); YAML and a large
    JSON body are decoded in a worker thread so the event loop keeps serving other requests
    (a small YAML body can still cost a parse of every alias it names)."""
    raw = await request.body()
    content_type = request.headers.get("content-type")
    small_json = len(raw) < _OFF_LOOP_BYTES and not _is_yaml(content_type)
    if small_json:
        return parse_body(raw, content_type, yaml_ok=yaml_ok)
    return await run_in_threadpool(parse_body, raw, content_type, yaml_ok=yaml_ok)
