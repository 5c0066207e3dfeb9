"""The NVMe swap folder a DeepSpeed job gets on its node: made at the moment of use beneath
the job's write roots, refused without an NVMe area or through a link, and removed rank by
rank as the job ends."""

from __future__ import annotations

import os

import pytest

from workers.storage.confine import ConfinementError, Roots
from workers.storage.nvme import (
    AIO_BLOCK_BYTES,
    NVME_ENV,
    remove_rank_swap,
    swap_buffer_elements,
    swap_folder,
)


def _env(area, *, write) -> dict:
    return {NVME_ENV: str(area), **Roots.of([], write).env()}


def test_the_job_folder_is_made_beneath_the_tenants_area(tmp_path):
    area = tmp_path / "nvme" / "team-a"
    folder = swap_folder("j-42", _env(area, write=[area]))
    assert folder == str(area / "j-42") and os.path.isdir(folder)


def test_without_an_nvme_area_the_field_and_the_setting_are_named():
    with pytest.raises(ConfinementError, match=r"offload nvme.*ETRAIN_POLICY_NVME_ROOT"):
        swap_folder("j-42", {})


def test_an_area_outside_the_write_roots_is_refused(tmp_path):
    area, ckpts = tmp_path / "elsewhere", tmp_path / "ckpts"
    with pytest.raises(ConfinementError):
        swap_folder("j-42", _env(area, write=[ckpts]))
    assert not area.exists()


def test_a_job_folder_swapped_for_a_link_out_is_refused(tmp_path):
    area, target = tmp_path / "nvme" / "team-a", tmp_path / "victim"
    area.mkdir(parents=True)
    target.mkdir()
    (area / "j-42").symlink_to(target)
    with pytest.raises(ConfinementError, match="link"):
        swap_folder("j-42", _env(area, write=[area]))
    with pytest.raises(ConfinementError):
        swap_folder("../team-b", _env(area, write=[area]))


def test_the_buffer_holds_the_largest_piece_in_whole_aio_blocks():
    block = AIO_BLOCK_BYTES // 4
    assert swap_buffer_elements([10, block]) == block
    assert swap_buffer_elements([block + 1, 3]) == 2 * block
    assert swap_buffer_elements([]) == block


def test_a_rank_removes_its_own_swap_files_and_the_last_the_folder(tmp_path):
    folder = tmp_path / "j-42"
    for kind in ("optimizer", "float32params"):
        for rank in (0, 1):
            (folder / "zero_stage_3" / kind / f"rank{rank}").mkdir(parents=True)
            (folder / "zero_stage_3" / kind / f"rank{rank}" / "0.swp").write_bytes(b"x")
    remove_rank_swap(str(folder), 0)
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.swp"))
    assert left == ["zero_stage_3/float32params/rank1/0.swp", "zero_stage_3/optimizer/rank1/0.swp"]
    remove_rank_swap(str(folder), 1)
    assert not folder.exists()


def test_zero3_partitions_parameters_in_the_dtype_it_is_given(monkeypatch):
    """Where the accelerator has no fp16, DeepSpeed's Init turns a given fp32 into bf16,
    and the NVMe parameter swapper it makes then swaps none of the fp32 parameters."""
    import torch

    from workers.strategies.deepspeed import _import_deepspeed

    _import_deepspeed()
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.partition_parameters import Init

    monkeypatch.setattr(get_accelerator(), "is_fp16_supported", lambda: False)
    init = Init.__new__(Init)  # only the dtype choice: no process group, no module
    init._set_dtype(None, torch.float32)
    assert init.dtype == torch.float32
    init._set_dtype(None, None)  # nothing given: DeepSpeed's own choice stands
    assert init.dtype == torch.bfloat16
