"""The topology: registration, the cycle check, kinds of tables, lineage in SQL and Python."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.barrier import DOWNSTREAM_SQL, UPSTREAM_SQL, CycleError, JobNotFoundError, Pipeline, TopologyError

from .conftest import make_tables


def chain(catalog: Catalog, p: Pipeline) -> None:
    """orders, users (roots) -> enriched -> by_region; orders -> big (a second branch)."""
    make_tables(catalog, "orders", "users", "enriched", "by_region", "big", "lonely")
    p.register_job("ingest", sinks=["s.orders", "s.users"], external_input=True)
    p.register_job("enrich", sources=["s.orders", "s.users"], sinks=["s.enriched"])
    p.register_job("regions", sources=["s.enriched"], sinks=["s.by_region"])
    p.register_job("filter", sources=["s.orders"], sinks=["s.big"])


def test_lineage_sql_and_python(catalog: Catalog, pipeline: Pipeline) -> None:
    chain(catalog, pipeline)
    topo = pipeline.topology
    assert topo.downstream("s.orders") == ["s.big", "s.by_region", "s.enriched"]
    assert topo.downstream("s.by_region") == []
    assert topo.upstream("s.by_region") == ["s.enriched", "s.orders", "s.users"]
    assert topo.roots() == ["s.orders", "s.users"]
    assert topo.kind("s.enriched") == "derived" and topo.kind("s.lonely") == "unmanaged"
    assert topo.related(["s.big"]) == ["s.big", "s.by_region", "s.enriched", "s.orders", "s.users"]
    # the documented SQL, run as plain SQL on the catalog database
    with catalog.backend.read() as conn:
        fed = [r[0] for r in conn.execute(sa.text(DOWNSTREAM_SQL), {"table": "s.users"})]
        feeds = [r[0] for r in conn.execute(sa.text(UPSTREAM_SQL), {"table": "s.big"})]
        flip = conn.execute(sa.text(
            "SELECT T.table_name FROM (SELECT job_id, source_table FROM ls_lineage) S "
            "JOIN (SELECT job_id, sink_table AS table_name FROM ls_lineage) T ON S.job_id = T.job_id "
            "WHERE S.source_table = 's.enriched'")).scalars().all()
        n_jobs = conn.execute(sa.text("SELECT count(*) FROM ls_job")).scalar()
    assert fed == ["s.by_region", "s.enriched"]
    assert feeds == ["s.orders"]
    assert flip == ["s.by_region"]
    assert n_jobs == 4


def test_cycles_are_refused(catalog: Catalog, pipeline: Pipeline) -> None:
    chain(catalog, pipeline)
    make_tables(catalog, "solo")
    pipeline.register_job("back", sources=["s.by_region"], sinks=["s.lonely"])
    gen = pipeline.topology.graph().generation
    with pytest.raises(CycleError) as ei:  # changing a job into a cycle
        pipeline.register_job("enrich", sources=["s.orders", "s.lonely"], sinks=["s.enriched"])
    assert ei.value.cycle == ["s.lonely", "s.enriched", "s.by_region", "s.lonely"]
    assert ei.value.job_id == "enrich"
    with pytest.raises(CycleError) as ei:
        pipeline.register_job("self", sources=["s.solo"], sinks=["s.solo"])
    assert ei.value.cycle == ["s.solo", "s.solo"]
    assert pipeline.topology.graph().generation == gen  # nothing changed
    assert pipeline.topology.job("enrich").sources == ("s.orders", "s.users")


def test_writers(catalog: Catalog, pipeline: Pipeline) -> None:
    chain(catalog, pipeline)
    with pytest.raises(TopologyError, match="already written by job 'enrich'"):
        pipeline.register_job("other", sources=["s.big"], sinks=["s.enriched"])
    with pytest.raises(TopologyError, match="either root or derived"):
        pipeline.register_job("feed", sinks=["s.big"], external_input=True)
    with pytest.raises(TopologyError, match="at least one sink"):
        pipeline.register_job("nothing", sources=["s.big"], sinks=[])
    pipeline.register_job("ingest2", sinks=["s.orders"], external_input=True)  # roots may have several
    assert pipeline.topology.graph().writers[catalog.load_table("s.orders").table_id] == ("ingest", "ingest2")


def test_change_and_retire_while_running(catalog: Catalog, pipeline: Pipeline) -> None:
    chain(catalog, pipeline)
    pipeline.register_job("filter", sources=["s.users"], sinks=["s.big"], description="now on users")
    assert pipeline.topology.downstream("s.users") == ["s.big", "s.by_region", "s.enriched"]
    assert "s.big" not in pipeline.topology.downstream("s.orders")
    retired = pipeline.retire_job("regions")
    assert not retired.active
    assert pipeline.topology.kind("s.by_region") == "unmanaged"
    assert pipeline.topology.downstream("s.enriched") == []
    with pytest.raises(JobNotFoundError):
        pipeline.retire_job("regions")
    assert [j.job_id for j in pipeline.topology.jobs(include_retired=True)] == ["enrich", "filter", "ingest", "regions"]
    pipeline.register_job("regions", sources=["s.enriched"], sinks=["s.by_region"])  # comes back
    assert pipeline.topology.downstream("s.enriched") == ["s.by_region"]
    catalog.drop_table("s.big")  # a dropped table leaves the lineage
    assert pipeline.topology.downstream("s.users") == ["s.by_region", "s.enriched"]


def test_bad_job_ids_and_tables(catalog: Catalog, pipeline: Pipeline) -> None:
    make_tables(catalog, "a")
    with pytest.raises(errors.InvalidIdentifierError):
        pipeline.register_job("bad id; drop", sinks=["s.a"], external_input=True)
    from lakestep.errors import TableNotFoundError

    with pytest.raises(TableNotFoundError):
        pipeline.register_job("j", sources=["s.nope"], sinks=["s.a"])


def test_a_cached_graph_follows_topology_changes_made_elsewhere(catalog_spec, catalog: Catalog,  # type: ignore[no-untyped-def]
                                                                 pipeline: Pipeline) -> None:
    """A pipeline plans and commits batches with the graph it read before (checked against the
    topology's generation in the same statement as the facts): a job registered, re-pointed or
    retired through another catalog (another process) is seen by its next plan and commit."""
    from lakestep.barrier import OPEN_EPOCH, StaleBatchError
    from lakestep.services import Coordinator

    from .conftest import kv

    make_tables(catalog, "a", "b", "d")
    pipeline.register_job("ingest", sinks=["s.a", "s.b"], external_input=True)
    coord = Coordinator(catalog, interval=3600)
    for t in ("s.a", "s.b"):
        catalog.load_table(t).append(kv((1, 1)), barrier=OPEN_EPOCH)
    coord.seal()
    assert pipeline.topology.graph().generation >= 1  # cached now
    elsewhere = catalog_spec.open()
    try:
        other = Pipeline(elsewhere)
        other.register_job("copy", sources=["s.a"], sinks=["s.d"])  # unknown to the cached graph
        plan = pipeline.next_batch("copy")
        assert plan is not None and list(plan.sources) == ["s.a"] and (plan.lo, plan.hi) == (1, 1)
        other.register_job("copy", sources=["s.b"], sinks=["s.d"])  # re-pointed
        plan = pipeline.next_batch("copy")
        assert plan is not None and list(plan.sources) == ["s.b"]
        with pipeline.batch(plan) as b:
            b.append("s.d", kv((2, 2)))
        assert b.result is not None and not b.result.replayed
        catalog.load_table("s.b").append(kv((3, 3)), barrier=OPEN_EPOCH)
        coord.seal()
        plan = pipeline.next_batch("copy")
        assert plan is not None and plan.lo == 2
        other.retire_job("copy")  # between the plan and the commit: the guard sees it
        with pytest.raises(StaleBatchError, match="retired"):
            with pipeline.batch(plan) as b:
                b.append("s.d", kv((4, 4)))
        with pytest.raises(JobNotFoundError):
            pipeline.next_batch("copy")
    finally:
        elsewhere.close()
        coord.stop()
