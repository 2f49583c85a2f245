"""A self-contained HTML page about a pipeline: ``lakestep report --html FILE``.

:func:`html_report` reads the catalog once (status, topology, lag history,
a consistent read over every managed table, the doctor's findings) and
renders one HTML document with inline CSS and SVG: it opens offline, with no
network access. Sections: the lineage graph, the barrier grid (tables x
barriers, coloured by state), each derived table's lag in barriers and in
seconds over the last hour, the explanation of a ``read_committed`` read of
every managed table (``Pipeline.choose(...).explanation``), and the doctor's
findings.

Example::

    from lakestep import Catalog
    from lakestep.report import html_report

    with open("pipeline.html", "w") as f:
        f.write(html_report(Catalog("postgresql://lake@db/lake", create=False)))

The package: :mod:`.data` reads what the page shows (:class:`ReportData`,
:func:`collect`), :mod:`.page` renders it (:func:`html_report`, :func:`render`),
:mod:`.svg` draws the lineage graph and the lag charts.
"""

from .data import ReportData, collect
from .page import CSS, ORDER, html_report, render

__all__ = ["CSS", "ORDER", "ReportData", "collect", "html_report", "render"]
