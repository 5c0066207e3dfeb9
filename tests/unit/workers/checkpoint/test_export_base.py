"""Where an export finds a LoRA checkpoint's base: a folder on this machine holding the
part it rebuilds, else an ExportError that names the base and the fix."""

from __future__ import annotations

import pytest

from workers.checkpoint.source import ExportError, local_base


def test_a_local_base_is_its_folder_with_or_without_file_scheme(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert local_base({"hf": str(tmp_path)}, "config.json", "fix") == str(tmp_path)
    assert local_base({"hf": f"file://{tmp_path}"}, "config.json", "fix") == str(tmp_path)


@pytest.mark.parametrize("where", ["s3://bucket/sd", "gs://b/m", "elsewhere"])
def test_a_base_elsewhere_is_refused_naming_it_and_the_fix(tmp_path, where):
    hf = where if "://" in where else str(tmp_path / where)
    with pytest.raises(ExportError, match="not on this machine's file system; copy it") as e:
        local_base({"hf": hf}, "model_index.json", "copy it")
    assert repr(hf) in str(e.value)


def test_a_folder_without_the_part_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a decoder's folder, not a pipeline's
    with pytest.raises(ExportError):
        local_base({"hf": str(tmp_path)}, "model_index.json", "fix")
