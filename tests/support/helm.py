"""helm/etrain rendered by Helm's own engine (helm-python-sdk: Helm's Go SDK in-process)."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "etrain"
NS = "ml"


def render(values: dict, *, release: str = "etrain") -> tuple[list[dict], str]:
    """The chart's objects and NOTES.txt, as `helm template` would print them."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=release, namespace=NS)
    objects = [
        doc
        for name, text in sorted(out.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return objects, out.get("etrain/templates/NOTES.txt", "")


def by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    """Objects by (kind, name)."""
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}
