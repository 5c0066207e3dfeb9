"""Request bodies: YAML aliases are measured on the node graph before anything is built."""

from __future__ import annotations

import time

import pytest
import yaml

from service.api import parsing
from service.api.parsing import MAX_DEPTH, MAX_VALUES, parse_body
from service.errors import InvalidSpec
from tests.unit.service.security.test_api_limits import LAUGHS

YAML = "application/yaml"


def _refusal(body: str) -> str:
    with pytest.raises(InvalidSpec) as e:
        parse_body(body.encode(), YAML)
    (item,) = e.value.errors
    assert item["loc"] == ["body"]
    return item["msg"]


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if the loader turns any node into a Python object."""

    def refuse(self, node):
        __tracebackhide__ = True  # the node's repr expands every alias
        raise AssertionError("a refused document was built")

    monkeypatch.setattr(parsing._YAML_LOADER, "construct_document", refuse)


def test_alias_bomb_is_refused_before_any_object_is_built(nothing_built):
    # 387 million values once expanded: measured as nine sums on the graph.
    started = time.thread_time()
    assert f"more than {MAX_VALUES} values once its aliases are expanded" in _refusal(LAUGHS)
    # This thread's CPU time (not wall time, which other processes stretch): expanding the
    # aliases up to the budget, as a walk of the built objects did, takes ~0.2 s.
    assert time.thread_time() - started < 0.05


def test_an_alias_that_holds_itself_is_refused(nothing_built):
    assert "an alias refers to itself" in _refusal("a: &a [1, *a]\n")


def test_aliases_count_for_depth(nothing_built):
    chain = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, MAX_DEPTH))
    assert f"nested deeper than {MAX_DEPTH} levels" in _refusal(chain)


def test_legal_aliases_and_merges_are_built():
    chain = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, MAX_DEPTH - 1))
    # The root mapping and 63 levels of lists: MAX_DEPTH levels in all.
    assert parse_body(chain.encode(), YAML)[f"a{MAX_DEPTH - 2}"] == _nested(MAX_DEPTH - 1)
    merged = "base: &b {lr: 0.1, steps: 5}\ntrain: {<<: *b, steps: 7}\n"
    assert parse_body(merged.encode(), YAML)["train"] == {"lr": 0.1, "steps": 7}
    wide = "x: &x [" + ", ".join(["1"] * 1000) + "]\n" + "".join(f"y{i}: *x\n" for i in range(150))
    assert len(parse_body(wide.encode(), YAML)) == 151  # 151 x 1001 + keys < MAX_VALUES
    too_wide = wide + "".join(f"z{i}: *x\n" for i in range(50))
    assert "aliases are expanded" in _refusal(too_wide)


def _nested(levels: int) -> list:
    value: list = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


def test_yaml_errors_stay_422s():
    assert "expected a single document" in _refusal("a: 1\n---\nb: 2\n")
    assert parse_body(b"", YAML) is None
    with pytest.raises(yaml.YAMLError):
        yaml.load("a: [", Loader=parsing._YAML_LOADER)  # the parser's error...
    assert "malformed application/yaml" in _refusal("a: [")  # ...is a 422 here
