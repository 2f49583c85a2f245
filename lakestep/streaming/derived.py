"""Derived jobs run from the driver: :class:`DerivedJob` (Spark's own scan and writer, no streaming query).

A derived job written as a Structured Streaming query (the ``lakestep``
source and sink) pays, in every micro-batch, for its rows' trips through
Python workers (the source decodes Parquet in Python, the sink encodes it
there) and for Spark's fixed per-trigger work (offset and commit logs,
planning through the Python data source's planner processes). A
:class:`DerivedJob` runs the same batch protocol (:mod:`lakestep.barrier.jobs`)
as a loop on the driver, and each batch is one plain Spark job:

1. **plan**: :meth:`Pipeline.next_batch <lakestep.barrier.Pipeline.next_batch>`:
   the barriers ``lo..hi`` every source has precommitted, carrying at most
   one barrier at which a source's data changed. Nothing ready: the loop
   waits ``poll`` seconds (less when this process commits a write to a
   catalog: :mod:`lakestep.catalog.signals`), and plans again once the job's change token
   (:meth:`Pipeline.change_token <lakestep.barrier.Pipeline.change_token>`:
   the open epoch, the topology, its tables' newest versions) differs, or
   after ``IDLE_REPLAN`` seconds;
2. **skip**: when no source's data changed in ``lo..hi`` the transform's
   output would be the sinks' present rows (a transform is a function of its
   sources' rows), so no Spark job runs: step 5 commits nothing but the
   barriers (``skip_unchanged=False`` runs the transform anyway);
3. **read**: the transform gets a :class:`Batch`. ``batch.changes(t)``: the
   rows source ``t`` gained in the batch (appended and upserted rows, as the
   ``lakestep`` streaming source gives them); ``batch.table(t)``: all its
   rows at ``hi``. Both are DataFrames over Spark's own Parquet scan of the
   files the plan names (sizes checked on the driver first, as
   :func:`lakestep.query.spark_sql` does: a changed or missing file raises
   :class:`~lakestep.errors.DataFileCorruptError` naming it). Where Spark's
   scan cannot read as lakestep does (an object store unless ``native=True``,
   nanosecond timestamps, unsigned integers; the merged rows of a
   primary-key table in ``table()``) the rows come through lakestep's reader
   in Python workers instead; :attr:`Batch.paths` says which ran;
4. **write**: the transform returns a DataFrame (one sink), a mapping of sink
   to DataFrame, or None (no rows). Each is checked on the driver against
   its sink's schema by the sink's rules
   (:class:`~lakestep.errors.SchemaMismatchError` before any file is written)
   and written as files of the sink, not yet visible: by Spark's own Parquet
   writer (:mod:`lakestep.streaming.native`) where it can (no primary key, a
   file-system location), else by lakestep's writer in Python workers
   (``mapInArrow``). Sink modes: ``append`` (the default), ``upsert``
   (primary-key tables' default: the newest row per key wins) and
   ``overwrite`` (the batch's rows replace the sink's);
5. **commit**: one :class:`~lakestep.barrier.JobBatch` transaction: the plan
   is checked to still hold (a rollback, or a second instance of the job
   that got there first, raises :class:`~lakestep.barrier.StaleBatchError`
   and discards this batch's files), then every sink is committed tagged
   ``hi``, an empty commit where a sink got no rows: it precommits
   ``lo..hi``.

**Exactly once, restarts.** The job's position is its sinks' frontier in the
catalog and nothing else: no checkpoint. A process killed before step 5
leaves files no commit names (orphans that cleanup removes after the
retention window); the restarted job plans the same barriers again. Killed
after step 5, it plans from ``hi + 1``. A commit is idempotent per (job,
barrier): a second instance committing the same barriers is told
``replayed`` and its files are deleted.

**An unavailable catalog database** is waited out at every step
(:func:`lakestep.retry.retrying`, the ``retry`` policy, default
:data:`lakestep.retry.STREAMING`), except a commit whose outcome became
unknown: it is never redone blindly (a redo would be told "replayed" and
delete the files the lost commit may have landed); the loop plans again
instead, which finds out.

Not guaranteed: a transform that reads anything but its :class:`Batch`
(another table, the clock) gets no consistency check; a transform that is
not a function of its sources' rows must set ``skip_unchanged=False``. Rows
pass through the driver only where a transform collects them.

Example::

    from lakestep.streaming import DerivedJob

    def daily(batch):                        # all orders at the batch's barrier, summed
        return batch.table("shop.orders").groupBy("day").agg(F.sum("cents").alias("cents"))

    job = DerivedJob(spark, url, "daily", sources=["shop.orders"], sinks={"shop.daily": "overwrite"},
                     transform=daily)
    running = job.start()                    # a driver thread; or job.run_once(), job.run_available()
    ...
    running.stop()
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .. import _failpoints
from .. import retry as _retry
from ..barrier import Pipeline
from ..barrier.jobs import BatchPlan, BatchResult, SourceRange
from ..catalog.storage import Storage, is_object_store
from ..errors import CatalogUnavailableError, InvalidArgumentError, SchemaMismatchError
from .catalog_cache import open_catalog, pipeline_of
from .scan import native_frame, plan_frame, python_frame, python_reason, spark_scan

if TYPE_CHECKING:
    from ..catalog import Catalog
    from .sink import FilesWritten, SinkTarget

log = logging.getLogger(__name__)

#: Sink modes of a derived job (step 4).
MODES = ("append", "upsert", "overwrite")
#: The thread switch interval (s) a running job lowers the process's to (``sys.setswitchinterval``).
SWITCH_INTERVAL = 0.0005
#: An idle job plans again after this many seconds even if its change token stayed equal.
IDLE_REPLAN = 1.0
#: What a transform returns: one DataFrame (a single sink), one per sink, or None.
Transform = Callable[["Batch"], Any]


@dataclass
class Batch:
    """What a transform reads: the batch's plan and its sources as DataFrames (step 3)."""

    plan: BatchPlan
    _job: "DerivedJob" = field(repr=False)
    #: per source read: ``"native"``, or ``"python (why)"`` where lakestep's reader ran
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def lo(self) -> int:
        return self.plan.lo

    @property
    def hi(self) -> int:
        """The barrier the batch's commits carry."""
        return self.plan.hi

    def _source(self, table: str) -> SourceRange:
        name = self._job._source_name(table)
        return self.plan.sources[name]

    def changes(self, table: str) -> Any:
        """The rows ``table`` gained in this batch (appended and upserted rows; for a
        primary-key table the new version of each upserted row, deletes not included)."""
        s = self._source(table)
        return self._job._changes(self, s)

    def table(self, table: str) -> Any:
        """All rows of ``table`` at the batch's barrier ``hi`` (merged, for a primary-key table)."""
        s = self._source(table)
        return self._job._snapshot(self, s)


@dataclass
class JobStats:
    """What a running job did (read by :class:`RunningJob` and the benchmarks)."""

    batches: int = 0  # committed by this process, the skipped ones included
    skipped: int = 0  # step 2: no source changed, no Spark job
    replayed: int = 0
    rows: int = 0  # rows written to the sinks
    last: BatchResult | None = None
    #: per batch (the last 1000): its barrier ``hi`` and the wall-clock times (time.time()) it started,
    #: was planned (step 1), had written its files (steps 2-4) and had committed (step 5)
    timings: list[dict[str, float]] = field(default_factory=list)


class DerivedJob:
    """A derived job whose batches run on the driver (module docstring).

    ``catalog``: a catalog URL or a :class:`~lakestep.catalog.Catalog`. ``sources``
    and ``sinks``: the job's tables; the job is registered with them (a job already
    registered keeps its registration where it names the same tables).
    ``sinks`` may map each sink to its mode (``append``, ``upsert``, ``overwrite``).
    ``transform(batch)``: see step 4. ``max_barriers``: the most barriers one batch
    covers (default: as many as are ready, up to the first at which a source's data
    changed). ``native``: None reads with Spark's own scan wherever it can, True also on
    object stores (Spark reaches the store itself), False never. ``writer``:
    ``"auto"`` (Spark's writer where it can), ``"spark"`` (refused where it cannot)
    or ``"arrow"``. ``switch_interval``: what a running job lowers the process's thread
    switch interval to (:func:`lower_switch_interval`; None leaves it).
    """

    def __init__(self, spark: Any, catalog: "Catalog | str", job: str, *, sources: Sequence[str],
                 sinks: Sequence[str] | Mapping[str, str], transform: Transform,
                 max_barriers: int | None = None, skip_unchanged: bool = True, native: bool | None = None,
                 writer: str = "auto", storage_options: Mapping[str, Any] | None = None,
                 retry: _retry.RetryPolicy | None = None, switch_interval: float | None = SWITCH_INTERVAL,
                 quiet_commit: float = 0.0) -> None:
        from ..catalog import Catalog

        if writer not in ("auto", "spark", "arrow"):
            raise InvalidArgumentError(f"writer must be 'auto', 'spark' or 'arrow', got {writer!r}",
                                       argument="writer", value=writer)
        if max_barriers is not None and max_barriers < 1:
            raise InvalidArgumentError("max_barriers must be >= 1", argument="max_barriers", value=max_barriers)
        if isinstance(catalog, Catalog):
            self.url, self.storage = catalog.connection_url(), catalog.storage
        else:
            self.url, self.storage = str(catalog), Storage.of(storage_options)
        self.spark, self.job, self.transform = spark, job, transform
        self.max_barriers, self.skip_unchanged, self.native, self.writer = \
            max_barriers, skip_unchanged, native, writer
        self.retry = retry or _retry.STREAMING
        self.switch_interval = switch_interval
        if quiet_commit < 0:
            raise InvalidArgumentError("quiet_commit must be >= 0", argument="quiet_commit", value=quiet_commit)
        self.quiet_commit = quiet_commit
        self._quiet_since: dict[int, float] = {}  # lo -> when a plan of only unchanged barriers was first seen
        self.stats = JobStats()
        from .datasource import prepare

        prepare(spark)  # Python workers that import lakestep; the "lakestep" format where Spark has it
        cat = self._catalog()
        self.sources = [cat.load_table(s).ident for s in sources]
        modes = dict(sinks) if isinstance(sinks, Mapping) else {s: None for s in sinks}
        self.modes: dict[str, str] = {}
        for name, mode in modes.items():
            t = cat.load_table(name)
            mode = mode or ("upsert" if t.primary_key else "append")
            if mode not in MODES:
                raise InvalidArgumentError(f"sink mode must be one of {MODES}, got {mode!r}",
                                           argument="sinks", value=mode)
            if mode == "upsert" and not t.primary_key:
                raise InvalidArgumentError(f"upsert mode upserts by primary key, and {t.ident} has none",
                                           argument="sinks", value=name)
            self.modes[t.ident] = mode
        self._register()
        self._targets: dict[str, SinkTarget] = {}
        self._checked: dict[tuple[str, str], bool] = {}  # (sink, batch schema json): Spark's writer?

    # ----------------------------------------------------------------- setup
    def _catalog(self) -> "Catalog":
        return open_catalog(self.url, self.storage)

    def _pipeline(self) -> Pipeline:
        """The process's pipeline on the job's catalog (its graph and table ids cached)."""
        return pipeline_of(self.url, self.storage)

    def _register(self) -> None:
        p = self._pipeline()
        from ..barrier import JobNotFoundError

        try:
            j = p.topology.job(self.job)
        except JobNotFoundError:
            j = None
        if j is None or set(j.sources) != set(self.sources) or set(j.sinks) != set(self.modes) \
                or j.external_input:
            p.register_job(self.job, sources=self.sources, sinks=list(self.modes))

    def _source_name(self, table: str) -> str:
        if table in self.sources:
            return table
        ident = self._catalog().load_table(table).ident
        if ident not in self.sources:
            raise InvalidArgumentError(f"{table} is not a source of job {self.job} ({self.sources})",
                                       argument="table", value=table)
        return ident

    def _target(self, sink: str) -> "SinkTarget":
        from .sink import SinkTarget

        t = self._targets.get(sink)
        if t is None:
            mode = {"append": "append", "upsert": "update", "overwrite": "complete"}[self.modes[sink]]
            t = self._targets[sink] = SinkTarget.open(self.url, sink, job=self.job, mode=mode,
                                                      storage=self.storage, retry=self.retry)
        return t

    def _fresh_targets(self) -> None:
        """Open again the sinks whose schema changed since their target was opened (a column
        added, renamed, dropped: docs/design.md §2.1), so this batch writes the schema of now."""
        cat = self._catalog()
        for sink, target in list(self._targets.items()):
            if cat.load_table(sink).schema.serialize().to_pybytes() != target.shape.schema_ipc:
                del self._targets[sink]
                self._checked = {k: v for k, v in self._checked.items() if k[0] != sink}

    # ----------------------------------------------------------------- reads
    def _changes(self, batch: Batch, s: SourceRange) -> Any:
        cat = self._catalog()
        t = cat.load_table(s.table)
        files = t.added_files(s.from_data_version, s.to_data_version) \
            if s.to_data_version > s.from_data_version else []
        why = python_reason(t.location, t.physical_schema if t.primary_key else t.schema, self.native)
        if why is not None:  # lakestep's reader drops a primary-key table's tombstones itself
            batch.paths[f"changes {s.table}"] = f"python ({why})"
            return python_frame(self.spark, t, files)
        batch.paths[f"changes {s.table}"] = "native"
        df = spark_scan(self.spark, t, files, physical=bool(t.primary_key))
        if t.primary_key:  # upserted rows; tombstones are not rows
            from pyspark.sql import functions as F

            df = df.where(~F.col("_ls_deleted")).drop("_ls_deleted")
        return df

    def _snapshot(self, batch: Batch, s: SourceRange) -> Any:
        t = self._catalog().load_table(s.table)
        why = python_reason(t.location, t.physical_schema if t.primary_key else t.schema, self.native,
                            merged=bool(t.primary_key))
        plan = t.read_plan(version=s.to_version)
        if why is None:
            batch.paths[f"table {s.table}"] = "native"
            return native_frame(self.spark, plan)
        batch.paths[f"table {s.table}"] = f"python ({why})"
        # The plan made here, its pieces read by mapInArrow (no Python data source, on any Spark):
        # a restarted job's first read of a merged primary-key table took 3.7-3.8 s through the
        # data source (its planner worker started first), 1.8-1.9 s this way; later reads the same.
        return plan_frame(self.spark, plan)

    # ----------------------------------------------------------------- writes
    def _outputs(self, out: Any, plan: BatchPlan) -> dict[str, Any]:
        if out is None:
            return {}
        if isinstance(out, Mapping):
            got: dict[str, Any] = {}
            for name, df in out.items():
                ident = self._catalog().load_table(name).ident
                if ident not in self.modes:
                    raise InvalidArgumentError(f"the transform of job {self.job} returned rows for {name}, "
                                               f"not one of its sinks ({list(self.modes)})",
                                               argument="transform", value=name)
                got[ident] = df
            return {k: v for k, v in got.items() if k in plan.sinks and v is not None}
        if len(self.modes) != 1:
            raise InvalidArgumentError(f"job {self.job} has {len(self.modes)} sinks: its transform must return "
                                       "a mapping of sink to DataFrame", argument="transform", value=type(out))
        sink = next(iter(self.modes))
        return {sink: out} if sink in plan.sinks else {}

    def _spark_writes(self, sink: str, df: Any) -> bool:
        """Step 4's checks: the batch's columns against the sink's (raises
        SchemaMismatchError); whether Spark's own writer writes it."""
        from ..catalog.writes import conform
        from .compat import to_arrow_schema
        from .native import check_target

        target = self._target(sink)
        key = (sink, df.schema.json())  # df.schema is cached by the DataFrame: one call to the JVM
        if key in self._checked:
            return self._checked[key]
        lacks = target.lacks(df.schema.fieldNames())
        if lacks:
            raise SchemaMismatchError(sink, [f"columns not in the table: {lacks}"])
        try:
            arrow = to_arrow_schema(df.schema)
        except Exception as e:  # a Spark type Arrow has no form for
            raise SchemaMismatchError(sink, [f"the batch's schema has no Arrow form: {e}"]) from e
        conform(arrow.empty_table(), target.shape.schema, sink)
        spark = self.writer == "spark"
        if self.writer == "auto":
            spark = not target.shape.primary_key and not is_object_store(target.shape.location)
        if spark:
            check_target(self._catalog().load_table(sink), None)
        self._checked[key] = spark
        return spark

    def _write(self, sink: str, df: Any, plan: BatchPlan) -> "FilesWritten":
        from .native import write

        target = self._target(sink)
        if self._spark_writes(sink, df):
            return write(df, target, plan.hi, schema_json=df.schema.json())
        from .sink import FilesWritten, task_writer

        msgs = [pickle.loads(r[0]) for r in df.mapInArrow(task_writer(target, plan.hi), "m binary").collect()]
        out = FilesWritten()
        for m in msgs:
            out.files += m.files
            out.rows += m.rows
        return out

    # ----------------------------------------------------------------- one batch
    def _plan(self) -> BatchPlan | None:
        return _retry.retrying(lambda: self._pipeline().next_batch(self.job, max_barriers=self.max_barriers),
                               policy=self.retry, what=f"job {self.job} (plan)")

    def run_once(self, *, force: bool = False) -> BatchResult | None:
        """Steps 1-5 for the next batch, if one is ready (None otherwise; also while barriers without
        changes wait out ``quiet_commit``, unless ``force``)."""
        t0 = time.time()
        plan = self._plan()
        if plan is None:
            return None
        t1 = time.time()
        changed = any(s.to_data_version != s.from_data_version for s in plan.sources.values()
                      if s.kind != "unmanaged")
        if not changed and self.skip_unchanged and self.quiet_commit > 0 and not force:
            # step 2, deferred: a batch that carries data later covers these barriers too
            first = self._quiet_since.setdefault(plan.lo, time.monotonic())
            if time.monotonic() - first < self.quiet_commit:
                return None
        self._quiet_since.clear()
        written: dict[str, FilesWritten] = {}
        batch = Batch(plan, self)
        ran = changed or not self.skip_unchanged
        if ran:
            self._fresh_targets()
            outputs = self._outputs(self.transform(batch), plan)
            try:
                for sink, df in outputs.items():
                    written[sink] = self._write(sink, df, plan)
            except BaseException:
                self._discard(written)
                raise
        _failpoints.hit("derived.written")
        t2 = time.time()
        result = self._commit(plan, written)
        _failpoints.hit("derived.committed")
        t3 = time.time()
        st = self.stats
        st.batches += 1
        st.skipped += not ran
        st.replayed += result.replayed
        st.rows += 0 if result.replayed else sum(w.rows for w in written.values())
        st.last = result
        st.timings.append({"barrier": plan.hi, "start": t0, "planned": t1, "written": t2, "committed": t3,
                           "ran": ran})
        del st.timings[:-1000]
        log.debug("job %s: barriers %d..%d committed (%s)", self.job, plan.lo, plan.hi,
                  "replayed" if result.replayed else f"{sum(w.rows for w in written.values())} rows")
        return result

    def _commit(self, plan: BatchPlan, written: "dict[str, FilesWritten]") -> BatchResult:
        """Step 5. Waits out an unavailable database before the commit starts; a commit whose
        outcome became unknown raises (the caller plans again: module docstring)."""
        p = self._pipeline()

        def commit() -> BatchResult:
            with p.batch(plan) as b:
                for sink, w in written.items():
                    b.add_files(sink, w.files, mode="overwrite" if self.modes[sink] == "overwrite" else "append")
            assert b.result is not None
            return b.result

        try:
            return commit()
        except CatalogUnavailableError as e:
            if getattr(e, "outcome_unknown", False):
                raise
            # certainly not committed: the connection failed before the commit; files kept, retried
            return _retry.retrying(commit, policy=self.retry, what=f"job {self.job} (commit barrier {plan.hi})")

    def _discard(self, written: "dict[str, FilesWritten]") -> None:
        for sink, w in written.items():
            store = self._target(sink).shape.store()
            for f in w.files:
                try:
                    store.delete(f.path)
                except Exception as e:  # orphans are harmless; cleanup collects them
                    log.debug("could not delete %s: %s", f.path, e)

    # ----------------------------------------------------------------- loops
    def run(self, *, stop: threading.Event | None = None, poll: float = 0.02,
            until: Callable[[], bool] | None = None, force: bool = False, every: float | None = None) -> None:
        """Run batches until ``stop`` is set or ``until()`` is true (checked between batches),
        waiting ``poll`` seconds whenever nothing is ready. ``every``: at most one batch that
        runs the transform per ``every`` seconds (as a processing-time trigger; a batch
        carries at most one barrier at which a source's data changed, so a job that runs
        less often than its sources change falls further behind). A commit whose
        outcome became unknown is not an error here: the next plan finds out (module docstring)."""
        if every is not None and every < 0:
            raise InvalidArgumentError("every must be >= 0 seconds", argument="every", value=every)
        stop = stop or threading.Event()
        next_run = 0.0
        lower_switch_interval(self.switch_interval)
        watched = self.sources + list(self.modes)
        replan = min(IDLE_REPLAN, self.quiet_commit) if self.quiet_commit > 0 else IDLE_REPLAN
        idle: tuple[Any, ...] | None = None  # the change token when the last plan found nothing ready
        idle_since = 0.0
        from ..catalog import signals

        seen = signals.sequence()
        while not stop.is_set() and not (until is not None and until()):
            try:
                # Step 1 only when something it depends on changed (or after IDLE_REPLAN s): an idle
                # job's poll is three indexed reads, not a plan (Pipeline.change_token).
                if every and time.monotonic() < next_run:
                    stop.wait(min(poll, next_run - time.monotonic()))
                    continue
                token = self._pipeline().change_token(watched)
                if token == idle and time.monotonic() - idle_since < replan:
                    seen = signals.wait(seen, poll)  # a write of this process wakes it at once
                    continue
                started = time.monotonic()
                done = self.run_once(force=force)
            except CatalogUnavailableError as e:
                log.warning("job %s: %s; planning again", self.job, e)
                idle = None
                stop.wait(poll)
                continue
            if done is None:
                if token != idle:
                    idle, idle_since = token, time.monotonic()
                seen = signals.wait(seen, poll)
            else:
                idle = None
                if every and self.stats.timings and self.stats.timings[-1].get("ran"):
                    next_run = started + every

    def run_available(self) -> int:
        """Process every barrier ready now (all the job's sources have precommitted it), then return
        the job's frontier (Structured Streaming's ``Trigger.AvailableNow``)."""
        p = self._pipeline()
        target = _retry.retrying(lambda: p.ready_barrier(self.job), policy=self.retry, what=f"job {self.job}")
        self.run(until=lambda: p.job_frontier(self.job) >= target, force=True)
        return p.job_frontier(self.job)

    def start(self, *, poll: float = 0.02, every: float | None = None) -> "RunningJob":
        """Run the job in a thread of this process (its Spark jobs run as any others of the session);
        ``poll`` and ``every`` as in :meth:`run`."""
        return RunningJob(self, poll, every)


def lower_switch_interval(seconds: float | None) -> None:
    """Lower the interpreter's thread switch interval to ``seconds`` (never raise it; None: leave it).

    Every call a driver makes to Spark's JVM waits for the answer with the GIL released, then
    waits to take it back: behind a busy Python thread (another job's planning, a coordinator,
    an application's own work) that takes up to the switch interval, 5 ms by default. A batch
    makes a few dozen such calls; measured (one CPU-bound thread beside a job, local mode), a
    batch took 0.50 s at 5 ms and 0.22 s at 0.5 ms, 0.15 s with nothing beside it. The setting is
    the process's, and it stays after the job stops."""
    import sys

    if seconds is not None and sys.getswitchinterval() > seconds:
        log.info("lowering the interpreter's thread switch interval from %g s to %g s (DerivedJob "
                 "switch_interval; calls to Spark's JVM wait for the GIL behind busy threads)",
                 sys.getswitchinterval(), seconds)
        sys.setswitchinterval(seconds)


class RunningJob:
    """A :class:`DerivedJob` running in a driver thread: ``stop()``, ``error``, ``await_termination()``."""

    def __init__(self, job: DerivedJob, poll: float, every: float | None = None) -> None:
        self.job = job
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(poll, every), name=f"lakestep-job-{job.job}",
                                        daemon=True)
        self._thread.start()

    def _run(self, poll: float, every: float | None) -> None:
        try:
            self.job.run(stop=self._stop, poll=poll, every=every)
        except BaseException as e:  # reported by error / await_termination
            log.error("job %s failed: %s", self.job.job, e)
            self.error = e

    @property
    def is_active(self) -> bool:
        return self._thread.is_alive()

    @property
    def stats(self) -> JobStats:
        return self.job.stats

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop after the batch in progress (it commits, or fails as a whole)."""
        self._stop.set()
        self._thread.join(timeout)

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; raise its error if it failed. True if it ended."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return not self._thread.is_alive()
