"""Health checks of a pipeline: what ``lakestep doctor`` reports.

:func:`diagnose` reads :func:`~lakestep.barrier.status.status` and looks for:

* **coordinator**: nobody holds the lease (no epoch is sealed), or the holder's
  lease expired without being released (it died; a standby takes over only if
  one runs);
* **jobs**: derived jobs behind the newest sealed barrier, by how many
  barriers and seconds; a job is *stuck* when input has been ready for it for
  ``stuck_after`` seconds and it has not committed for as long (a job only
  waiting for its sources is lagging, not stuck: the finding names the source);
  jobs catching up after registering late; jobs whose frontier is below the
  oldest retained barrier (docs/design.md §7: they cannot be read
  consistently at their frontier);
* **locks**: leased version locks that lapsed (their readers died) and are
  still recorded until cleanup prunes them;
* **storage** (``storage=True``; one cleanup dry run per table, the slow
  part): orphan files older than the retention window, expired files cleanup
  would delete, and snapshots or locks that keep expired files
  (pins.py);
* **retention**: barriers no longer retained (coordinator snapshot
  retention), tables whose history cleanup pruned;
* **publishing** (when the catalog publishes its tables as Iceberg tables,
  lakestep/iceberg): how many committed barriers have no complete cut of
  tags yet and for how long, when the last round ran, the last round's error,
  and each table left out of publishing with its reason.

Each :class:`Finding` has a severity: ``ok``, ``info``, ``warning`` or
``error``; :attr:`Diagnosis.healthy` means no error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

import sqlalchemy as sa

from ..catalog import retention
from ..catalog import schema as S
from ..catalog.pins import pinned_storage
from ..errors import InvalidArgumentError
from .graph import Job
from .snapshots import SNAPSHOT_PREFIX
from .status import Status, TableStatus, status
from .topology import Topology

if TYPE_CHECKING:
    from ..catalog import Catalog

Severity = Literal["ok", "info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = ("ok", "info", "warning", "error")


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found; ``facts`` holds the numbers behind the message."""

    check: str  # coordinator, job, locks, orphans, reclaimable, pins, retention
    severity: Severity
    subject: str  # "coordinator", a job id or a table name
    message: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Diagnosis:
    status: Status
    findings: list[Finding]

    @property
    def healthy(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def worst(self) -> Severity:
        return max((f.severity for f in self.findings), key=SEVERITIES.index, default="ok")


def diagnose(catalog: "Catalog", *, stuck_after: float = 300.0, storage: bool = True,
             on_table: Callable[[str], None] | None = None) -> Diagnosis:
    """Run every check (module docstring). ``on_table`` is called before each table's
    storage check (for a progress bar)."""
    if stuck_after < 0:
        raise InvalidArgumentError("stuck_after must be >= 0", argument="stuck_after", value=stuck_after)
    topology = Topology(catalog)
    st = status(catalog, topology, last=1)
    jobs = topology.jobs()
    out = _coordinator(st, bool(jobs))
    for job in jobs:
        out += _job(st, job, stuck_after)
    with catalog.backend.read() as conn:
        lk = S.locks.c
        lapsed = conn.execute(sa.select(lk.locker, lk.table_id, lk.version, lk.expires_at).where(
            retention.lapsed(S.locks, st.now)).order_by(lk.expires_at)).all()
        c = S.commits.c
        oldest = {int(r[0]): int(r[1]) for r in conn.execute(
            sa.select(c.table_id, sa.func.min(c.version)).group_by(c.table_id))}
    names = {t.table_id: t.table for t in st.tables.values()}
    for r in lapsed:
        out.append(Finding("locks", "info", names.get(int(r.table_id), str(r.table_id)),
                           f"the version lock of {r.locker!r} on version {r.version} lapsed "
                           f"{duration_text(st.now - float(r.expires_at))} ago (its reader stopped renewing it); "
                           "cleanup prunes it",
                           {"locker": r.locker, "version": int(r.version), "expired_at": float(r.expires_at)}))
    out += _retention(st, oldest)
    out += _publishing(catalog, st.now)
    if storage:
        for t in st.tables.values():
            if on_table is not None:
                on_table(t.table)
            out += _storage(catalog, t)
    return Diagnosis(st, out)


#: Barriers a publisher may be behind before the doctor warns.
PUBLISH_LAG_WARNING = 10


def _publishing(catalog: "Catalog", now: float) -> list[Finding]:
    from .publishing import status as publishing

    p = publishing(catalog)
    if not p.published:
        return []
    facts = {"enabled": p.enabled, "complete": p.complete, "committed": p.committed, "lag": p.lag,
             "holder": p.holder, "round_at": p.round_at}
    out: list[Finding] = []
    seconds = None if p.behind_since is None else now - p.behind_since
    last = "never" if p.round_at is None else f"{duration_text(now - p.round_at)} ago"
    if p.complete is None:
        out.append(Finding("publishing", "warning", "publisher",
                           f"no barrier published to Iceberg yet (committed barrier {p.committed}; last round {last})",
                           facts))
    elif p.lag:
        sev: Severity = "warning" if p.lag > PUBLISH_LAG_WARNING else "info"
        out.append(Finding("publishing", sev, "publisher",
                           f"Iceberg tags reach barrier {p.complete}, {p.lag} barrier(s) behind the committed "
                           f"{p.committed} for {duration_text(seconds)}; last round {last}",
                           {**facts, "seconds_behind": seconds}))
    else:
        out.append(Finding("publishing", "ok", "publisher",
                           f"every committed barrier up to {p.complete} has its Iceberg tags; last round {last}", facts))
    if p.error:
        out.append(Finding("publishing", "error", "publisher", f"the last publishing round failed: {p.error}", facts))
    for name, row in sorted(p.tables.items()):
        if row.get("error"):
            out.append(Finding("publishing", "error", name, f"not published to Iceberg: {row['error']}",
                               {"error_at": row.get("error_at")}))
    return out


def duration_text(seconds: float | None) -> str:
    """A length of time for people ("42.0 s", "3.5 min", "2.0 h", "9.1 d"); "-" for None.
    The CLI, the report and the diagnoses all print durations with it."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _coordinator(st: Status, has_jobs: bool) -> list[Finding]:
    lease = st.lease
    newest = st.seals.get(st.sealed)
    seal = (f"newest seal: barrier {st.sealed}, {duration_text(st.now - newest)} ago" if newest is not None
            else "no epoch sealed yet")
    facts = {"holder": lease.holder, "token": lease.token, "expires_at": lease.expires_at, "open_epoch": st.open_epoch,
             "open_for_seconds": st.now - st.opened_at, "sealed": st.sealed}
    if st.coordinator_alive:
        return [Finding("coordinator", "ok", "coordinator",
                        f"held by {lease.holder!r} (token {lease.token}), lease expires in "
                        f"{duration_text(lease.expires_at - st.now)}; {seal}", facts)]
    severity: Severity = "error" if has_jobs else "warning"
    if lease.holder is not None:
        return [Finding("coordinator", severity, "coordinator",
                        f"the coordinator lease expired {duration_text(st.now - lease.expires_at)} ago (holder "
                        f"{lease.holder!r}, token {lease.token}) and no standby took it over: nothing seals; "
                        f"epoch {st.open_epoch} has been open for {duration_text(st.now - st.opened_at)}; {seal}", facts)]
    return [Finding("coordinator", severity, "coordinator",
                    f"no coordinator holds the lease: nothing seals; epoch {st.open_epoch} has been open for "
                    f"{duration_text(st.now - st.opened_at)}; {seal} (start one: lakestep coordinator)", facts)]


def _job(st: Status, job: Job, stuck_after: float) -> list[Finding]:
    pos = st.job(job)
    if pos is None:
        return []
    last = pos.last_commit_at
    if pos.frontier is None or pos.behind is None or pos.lag_seconds is None:  # a root job
        return [Finding("job", "ok", job.job_id,
                        f"root job writing {', '.join(job.sinks)}: last commit {duration_text(st.now - last)} ago",
                        {"kind": "root", "last_commit_at": last})]
    sinks = [st.tables[s] for s in job.sinks if s in st.tables]
    fr, behind, lag = pos.frontier, pos.behind, pos.lag_seconds
    sources: list[TableStatus] = [st.tables[s] for s in job.sources if s in st.tables]
    managed = [s for s in sources if s.frontier is not None]
    input_at = min((s.frontier for s in managed if s.frontier is not None), default=st.sealed)
    ready = max(0, input_at - fr)
    facts: dict[str, Any] = {"kind": "derived", "frontier": fr, "behind": behind, "lag_seconds": lag,
                             "ready": ready, "last_commit_at": last, "sinks": list(job.sinks)}
    out: list[Finding] = []
    since = st.oldest_retained
    if since is not None and fr < since:
        out.append(Finding("job", "error", job.job_id,
                           f"frontier {fr} is below the oldest retained barrier {since}: its sinks cannot be read "
                           "consistently at their frontier (BarrierNotRetainedError)", {**facts, "since": since}))
    catching = any(t.catching_up for t in sinks)
    if catching:
        out.append(Finding("job", "info", job.job_id,
                           f"catching up since it registered at committed barrier {job.joined_barrier}: frontier "
                           f"{fr}, left out of the COMMIT set until it reaches {job.joined_barrier}",
                           {**facts, "joined_barrier": job.joined_barrier}))
    if behind <= 0:
        out.append(Finding("job", "ok", job.job_id, f"up to date: frontier {fr} = newest sealed barrier", facts))
        return out
    where = f"{behind} barrier(s), {duration_text(lag)}, behind sealed barrier {st.sealed} (frontier {fr})"
    idle = st.now - last
    if ready > 0 and lag >= stuck_after and idle >= stuck_after:
        out.append(Finding("job", "error", job.job_id,
                           f"stuck: input for {ready} barrier(s) is ready and it has not committed for "
                           f"{duration_text(idle)}; {where}", {**facts, "stuck": True}))
    elif ready > 0:
        out.append(Finding("job", "warning", job.job_id,
                           f"lagging: {where}; input for {ready} barrier(s) is ready", {**facts, "stuck": False}))
    else:
        slow = min(managed, key=lambda s: (s.frontier or 0, s.table))
        out.append(Finding("job", "warning", job.job_id,
                           f"lagging: {where}; waiting for its source {slow.table} (frontier {slow.frontier}, "
                           f"job {slow.job!r})", {**facts, "stuck": False, "waiting_for": slow.table}))
    return out


def _retention(st: Status, oldest_version: dict[int, int]) -> list[Finding]:
    out = []
    since = st.oldest_retained
    if since is not None and since > 1:
        out.append(Finding("retention", "info", "barriers",
                           f"barriers 1..{since - 1} are no longer retained (the coordinator's snapshot retention): "
                           f"reads at them raise BarrierNotRetainedError; the oldest retained barrier is {since}",
                           {"oldest_retained": since, "pruned_below": since}))
    for t in st.tables.values():
        v = oldest_version.get(t.table_id, 0)
        if v > 0:
            out.append(Finding("retention", "info", t.table,
                               f"cleanup pruned the history below version {v}: time travel to older versions "
                               "is no longer possible", {"oldest_version": v}))
    return out


def _storage(catalog: "Catalog", t: TableStatus) -> list[Finding]:
    table = catalog.load_table(t.table)
    rep = table.cleanup(dry_run=True)
    out = []
    if rep.orphan_files:
        out.append(Finding("orphans", "warning", t.table,
                           f"{len(rep.orphan_files)} orphan file(s), {rep.orphan_bytes} bytes, older than the "
                           f"retention window ({duration_text(table.retention_seconds)}) and in no commit: "
                           "`lakestep cleanup --yes` deletes them",
                           {"files": list(rep.orphan_files), "bytes": rep.orphan_bytes}))
    if rep.deleted_files:
        out.append(Finding("reclaimable", "info", t.table,
                           f"cleanup would delete {len(rep.deleted_files)} expired file(s), {rep.deleted_bytes} bytes",
                           {"files": len(rep.deleted_files), "bytes": rep.deleted_bytes}))
    pins = pinned_storage(table)
    barrier_pins = [p for p in pins.pins if p.name.startswith(SNAPSHOT_PREFIX) and p.kind == "snapshot" and p.files]
    iceberg_pins = [p for p in pins.pins if p.kind == "iceberg" and p.files]  # the publisher's retention
    if iceberg_pins:
        files = sum(p.files for p in iceberg_pins)
        out.append(Finding("pins", "info", t.table,
                           f"{len(iceberg_pins)} published Iceberg snapshot(s) keep {files} expired file(s) from "
                           "cleanup until the publisher's retention lets them go",
                           {"iceberg_snapshots": len(iceberg_pins), "files": files,
                            "bytes": sum(p.bytes for p in iceberg_pins)}))
    for p in pins.pins:
        if p.files and p not in barrier_pins and p.kind != "iceberg":
            what = f"snapshot {p.name!r}" if p.kind == "snapshot" else f"the version lock of {p.name!r}"
            out.append(Finding("pins", "warning", t.table,
                               f"{what} pins version {p.version} and keeps {p.files} expired file(s), {p.bytes} "
                               "bytes, from cleanup",
                               {"kind": p.kind, "name": p.name, "version": p.version, "files": p.files,
                                "bytes": p.bytes, "expires_at": p.expires_at}))
    if barrier_pins:
        files = sum(p.files for p in barrier_pins)
        out.append(Finding("pins", "info", t.table,
                           f"{len(barrier_pins)} barrier snapshot(s) (barriers "
                           f"{min(p.barrier or 0 for p in barrier_pins)}..{max(p.barrier or 0 for p in barrier_pins)})"
                           f" keep {files} expired file(s) from cleanup",
                           {"snapshots": len(barrier_pins), "files": files, "bytes": sum(p.bytes for p in barrier_pins)}))
    return out
