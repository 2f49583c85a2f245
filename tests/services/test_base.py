"""The services' one base (lakestep/services/base.py): its steps, each on a service of the
test's own whose rounds do what the step is about, then the three real services' health."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from lakestep import Catalog, Coordinator, MaintenanceLoop
from lakestep.errors import CatalogUnavailableError, CatalogWaitExpiredError, InternalError
from lakestep.retry import RetryPolicy
from lakestep.services import PublishLoop, Service

from ..waiting import wait_until

QUICK = RetryPolicy(initial=0.001, max_delay=0.001, deadline=None)


class Script(Service):
    """Rounds that follow a script: an int is returned, an exception raised."""

    def __init__(self, script: list[Any], *, survives: bool = True, retry: RetryPolicy = QUICK) -> None:
        super().__init__("script", interval=0.0, retry=retry)
        self.script = list(script)
        self.survives_errors = survives
        self.finished = 0
        self.calls = 0

    def round(self) -> int:
        self.calls += 1
        step = self.script.pop(0) if self.script else 0
        if isinstance(step, BaseException):
            raise step
        return int(step)

    def enough(self, result: Any) -> bool:
        return result == 99

    def finish(self) -> None:
        self.finished += 1


def test_rounds_results_and_limits() -> None:
    s = Script([1, 2, 3, 4])
    seen: list[int] = []
    assert s.run(max_rounds=3, on_round=seen.append) == [1, 2, 3] == seen
    assert (s.rounds, s.errors, s.finished) == (3, 0, 1)
    assert s.run(max_rounds=5) == [4, 0, 0, 0, 0]  # the script ran out: its rounds return 0
    assert s.rounds == 8 and s.finished == 2
    assert Script([5, 99, 7]).run() == [5, 99]  # enough() ends the loop


def test_the_database_away_is_waited_out_and_the_round_redone() -> None:
    away = CatalogUnavailableError("the catalog database is unavailable", outcome_unknown=True)
    s = Script([away, away, 7])
    assert s.run(max_rounds=1) == [7]
    assert (s.calls, s.rounds, s.errors) == (3, 1, 0)  # two waits, one round
    h = s.health()
    assert (h.rounds, h.errors, h.last_error, h.waiting_for_database, h.running) == (1, 0, None, False, False)
    assert h.last_round_at is not None


def test_a_deadline_on_the_wait_ends_the_loop() -> None:
    away = CatalogUnavailableError("the catalog database is unavailable")
    s = Script([away] * 1000, retry=RetryPolicy(initial=0.001, max_delay=0.001, deadline=0.0, attempts=2))
    with pytest.raises(CatalogWaitExpiredError):
        s.run()
    assert s.finished == 1  # step 4 however the loop ends


def test_other_errors_survived_or_not() -> None:
    s = Script([1, InternalError("a bug"), 3])
    assert s.run(max_rounds=3) == [1, 3]
    assert (s.rounds, s.errors) == (3, 1) and s.health().last_error == "InternalError: a bug"
    strict = Script([1, InternalError("a bug"), 3], survives=False)
    with pytest.raises(InternalError):
        strict.run()
    assert strict.finished == 1 and strict.rounds == 1


def test_a_thread_started_stopped_and_started_again() -> None:
    s = Script([])
    s.interval = 3600.0  # a long pause: stop() must cut it short
    t = s.start()
    assert s.start() is t  # a running service's start returns its thread
    wait_until(lambda: s.rounds >= 1, "the first round")
    assert s.health().running
    s.stop(timeout=30)
    assert not t.is_alive() and s.finished == 1 and not s.health().running
    s.start()
    wait_until(lambda: s.rounds >= 2, "a round of the restarted service")
    s.wake()  # ends the hour's pause: the next round starts now
    wait_until(lambda: s.rounds >= 3, "the round wake() started")
    s.stop(timeout=30)
    assert s.finished == 2


def test_the_real_services_report_their_health(catalog: Catalog) -> None:
    coord = Coordinator(catalog, interval=0.01, lease_seconds=30.0, holder="health")
    assert coord.run(max_seals=2) and coord.health().rounds >= 2
    assert coord.health().name == "coordinator health" and not coord.is_leader  # released on the way out
    catalog.create_namespace("s")
    catalog.create_table("s.t", pa.schema([("k", pa.int64())])).append({"k": [1]})
    maint = MaintenanceLoop(catalog, interval=0.01, min_files=2)
    reports = maint.run(max_rounds=2)
    assert [r.round for r in reports] == [1, 2] and maint.health().rounds == 2 and maint.errors == 0
    maint.start()
    wait_until(lambda: maint.rounds >= 3, "a round in the thread")
    maint.stop(timeout=30)
    assert maint.health().errors == 0


def test_the_publisher_loop(catalog: Catalog) -> None:
    pytest.importorskip("pyiceberg")
    from lakestep.iceberg import Publisher, enable

    enable(catalog, True)
    pub = Publisher(catalog, holder="loop")
    loop = PublishLoop(pub, interval=0.01)
    reports = loop.run(max_rounds=2)
    assert len(reports) == 2 and all(r.leader for r in reports) and pub.rounds == 2
    assert loop.health().rounds == 2
    # the lease was given up on the way out: another publisher leads at once
    other = Publisher(catalog, holder="other")
    try:
        assert other.publish().leader
    finally:
        other.close()
        pub.close()
