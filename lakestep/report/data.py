"""What the report page shows, read from one catalog: :class:`ReportData` and :func:`collect`.

:func:`collect` reads the catalog once: the status, the topology, the lag
history of every derived table, a ``read_committed`` read over every managed
table (its explanation), and the doctor's findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..barrier import Diagnosis, LagSample, Pipeline, Status, diagnose
from ..barrier.graph import Job
from ..errors import LakestepError
from ..secrets import mask_url

if TYPE_CHECKING:
    from ..catalog import Catalog


@dataclass
class ReportData:
    """Everything the page shows, read from one catalog."""

    catalog: str
    status: Status
    jobs: list[Job]
    lag: dict[str, list[LagSample]]
    window: tuple[float, float]
    explanation: str
    diagnosis: Diagnosis | None
    generated_at: float = field(default=0.0)


def collect(catalog: "Catalog", *, last: int = 20, seconds: float = 3600.0, storage: bool = True,
            stuck_after: float = 300.0, step: Callable[[str], None] | None = None) -> ReportData:
    """Read what the report shows. ``step(name)`` is called as each part is read (progress)."""
    step = step or (lambda _name: None)
    p = Pipeline(catalog)
    step("status")
    st = p.status(last=last)
    jobs = p.topology.jobs()
    step("lag history")
    lag = {t.table: p.lag_history(t.table, seconds=seconds) for t in st.tables.values() if t.kind == "derived"}
    step("consistent read")
    managed = [t.table for t in st.managed()]
    if not managed:
        explanation = "No managed table: no job is registered, so there is no barrier to read at."
    else:
        try:
            explanation = p.choose(managed).explanation.text()
        except LakestepError as e:
            explanation = f"read_committed over {', '.join(managed)} failed: {type(e).__name__}: {e}"
    step("doctor")
    diag = diagnose(catalog, storage=storage, stuck_after=stuck_after)
    return ReportData(mask_url(catalog.url), st, jobs, lag, (st.now - seconds, st.now), explanation, diag,
                      generated_at=st.now)
