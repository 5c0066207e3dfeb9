"""``etrain report``: tables and pictures from jobs the service ran.

:mod:`.tables` turns fetched JSON (metrics, memory, plans, events, goodput) into
rows: pure Python, no I/O. :mod:`.plots` draws the rows as PNGs with matplotlib
(imported only when a report is drawn, so the CLI starts fast) and
:mod:`.markdown` writes the ``report.md`` that embeds them.
"""
