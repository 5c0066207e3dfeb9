"""``report.md``: a report's tables and its PNGs (linked by file name, beside it)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from service.reports.tables import Table


def _cell(text: str) -> str:
    """A table cell with the characters markdown would read as structure escaped."""
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: Table) -> str:
    """A GitHub-flavoured markdown table."""
    lines = [
        "| " + " | ".join(_cell(h) for h in table.headers) + " |",
        "|" + "---|" * len(table.headers),
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def default_out(kind: str, now: datetime | None = None) -> Path:
    """``./etrain-report-<kind>-<UTC timestamp>``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return Path(f"etrain-report-{kind}-{stamp}")


def write_report(
    out: Path,
    title: str,
    intro: list[str],
    tables: list[Table],
    images: list[Path],
) -> Path:
    """Write ``out/report.md``: the title, intro lines, each table and each image."""
    parts = [f"# {title}", "", *intro, ""]
    for table in tables:
        parts += [f"## {table.title}", "", table_markdown(table), ""]
    for image in images:
        parts += [f"![{image.stem}]({image.name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(parts))
    return path
