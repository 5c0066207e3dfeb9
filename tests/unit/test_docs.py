"""The references in docs/ are what the code would generate, and the docs stand alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service import reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_generated_references_are_current():
    assert reference.stale(DOCS) == [], "run `make docs` and commit the result"


def test_the_check_notices_a_stale_file(tmp_path):
    for name, render in reference.FILES.items():
        (tmp_path / name).write_text(render())
    assert reference.stale(tmp_path) == []
    (tmp_path / "job-spec.md").write_text("# an old reference\n")
    assert reference.stale(tmp_path) == ["job-spec.md"]
    assert reference.main([str(tmp_path), "--check"]) == 1


def test_every_spec_field_is_in_the_reference():
    from workers.spec import JobSpec

    text = (DOCS / "job-spec.md").read_text()
    for section, field in JobSpec.model_fields.items():
        assert f"`{section}`" in text
        model = field.annotation
        for name, sub in getattr(model, "model_fields", {}).items():
            assert f"`{section}.{sub.alias or name}`" in text


DOC_FILES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "bench" / "README.md"]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_stand_alone_and_their_links_resolve(path):
    """Every relative link, and every relative path the text names, stays inside the
    repository and exists."""
    text = path.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    targets += re.findall(r"(?<![\w/.])(\.\./[\w./-]+)", text)
    for target in targets:
        if "://" in target:
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{path.name} points outside the repo: {target}"
        assert resolved.exists(), f"{path.name} links to missing {target}"
