"""The Hugging Face decoder families etrain trains, one small module each (no torch).

A family maps its ``config.json`` onto :class:`~workers.models.config.ModelConfig`
(what its forward changes in etrain's decoder) and says where its weight names differ
from Llama's; docs/model-families.md tells how to add one.
"""

from __future__ import annotations

from workers.models.families.common import Family
from workers.models.families.gemma import GEMMA
from workers.models.families.llama import LLAMA
from workers.models.families.phi3 import PHI3
from workers.models.families.qwen3 import QWEN3

FAMILIES: dict[str, Family] = {
    arch: family for family in (LLAMA, QWEN3, GEMMA, PHI3) for arch in family.architectures
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)


def family_of(architecture: str) -> Family:
    """The family of ``architecture`` (``KeyError`` if etrain has none)."""
    return FAMILIES[architecture]


__all__ = ["FAMILIES", "SUPPORTED_ARCHITECTURES", "Family", "family_of"]
