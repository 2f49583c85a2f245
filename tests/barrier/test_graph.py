"""Graph.component: the weakly connected component of tables, computed once per graph."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lakestep.barrier.graph import Graph, Job


def _job(name: str, sources: tuple[int, ...], sinks: tuple[int, ...], *, retired: bool = False) -> Job:
    return Job(name, not sources, tuple(f"t{i}" for i in sources), tuple(f"t{i}" for i in sinks), sources, sinks,
               0, 0.0, 0.0, 1.0 if retired else None)


def _naive(jobs: list[Job], start: set[int]) -> set[int]:
    """Reachability by repeated passes over the active jobs (the definition)."""
    found = set(start)
    changed = True
    while changed:
        changed = False
        for j in jobs:
            tables = set(j.source_ids) | set(j.sink_ids)
            if j.active and tables & found and not tables <= found:
                found |= tables
                changed = True
    return found


def test_components_of_a_small_topology() -> None:
    jobs = [_job("ingest", (), (1,)), _job("agg", (1,), (2,)), _job("mart", (2, 3), (4,)),
            _job("other", (), (5,)), _job("old", (5,), (1,), retired=True)]
    g = Graph.build(1, jobs, {})
    assert g.component([4]) == {1, 2, 3, 4}
    assert g.component([5]) == {5}  # the job joining it to the rest is retired
    assert g.component([4, 5]) == {1, 2, 3, 4, 5}
    assert g.component([99]) == {99}  # a table of no job
    assert g.component([]) == set()
    out = g.component([2])
    out.add(42)  # the caller's set: the cached component is not changed
    assert g.component([2]) == {1, 2, 3, 4}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sets(st.integers(0, 30), max_size=3), st.sets(st.integers(0, 30), min_size=1, max_size=2),
                          st.booleans()), max_size=25),
       st.sets(st.integers(0, 35), max_size=4))
def test_component_is_reachability(specs: list[tuple[set[int], set[int], bool]], start: set[int]) -> None:
    jobs = [_job(f"j{i}", tuple(sorted(src)), tuple(sorted(snk)), retired=retired)
            for i, (src, snk, retired) in enumerate(specs)]
    g = Graph.build(1, jobs, {})
    assert g.component(start) == _naive(jobs, start)
    assert g.component(start) == _naive(jobs, start)  # the second call answers from the cache
