"""Real worker processes for concurrency tests.

A :class:`Worker` is a spawned Python process holding its own :class:`Catalog`.
The test drives it step by step over a pipe, so two processes can prepare
changes against the same base version and then commit in an order the test
chooses: a real race, with its outcome made deterministic.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import traceback
from typing import Any

_CTX = mp.get_context("spawn")


class WorkerError(Exception):
    def __init__(self, kind: str, message: str, tb: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.tb = tb


def _main(pipe: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    from lakestep import Catalog

    catalogs: dict[tuple[str, str, tuple[tuple[str, str], ...]], Catalog] = {}

    def open_catalog(url: str, warehouse: str, storage: tuple[tuple[str, str], ...] = ()) -> Catalog:
        if (url, warehouse, storage) not in catalogs:
            for old in catalogs.values():  # one test at a time: close the last test's handles
                old.close()
            catalogs.clear()
            catalogs[(url, warehouse, storage)] = Catalog(url, warehouse=warehouse, storage_options=dict(storage))
        return catalogs[(url, warehouse, storage)]

    tx = None
    while True:
        msg = pipe.recv()
        cmd = msg[0]
        if cmd == "stop":
            break
        try:
            cat = open_catalog(*msg[1]) if cmd not in ("commit", "abort") else None
            if cmd == "prepare":
                _, _, op, table, args, kwargs, key = msg
                tx = cat.transaction(job_id=key[0], batch_id=key[1]) if key else cat.transaction()
                getattr(tx, op)(table, *args, **kwargs)
                pipe.send(("ok", None))
            elif cmd == "prepare_fn":  # a test-module function prepares inside the transaction
                _, _, module, func, args = msg
                import importlib

                tx = cat.transaction()
                getattr(importlib.import_module(module), func)(cat, tx, *args)
                pipe.send(("ok", None))
            elif cmd == "abort":  # the task fails before publishing
                assert tx is not None
                tx.abort()
                tx = None
                pipe.send(("ok", None))
            elif cmd == "commit":
                assert tx is not None
                results = tx.commit()
                tx = None
                pipe.send(("ok", [dataclasses.asdict(r) for r in results]))
            elif cmd == "call":  # run a module-level function of a test module
                _, _, module, func, args = msg
                import importlib

                pipe.send(("ok", getattr(importlib.import_module(module), func)(cat, *args)))
            else:
                raise ValueError(f"unknown command {cmd}")
        except Exception as e:  # reported to the test, which decides
            tx = None
            pipe.send(("error", type(e).__name__, str(e), traceback.format_exc()))
    for c in catalogs.values():
        c.close()


def _where(spec: Any) -> tuple[Any, ...]:
    """Which catalog a command is for: URL, warehouse and storage options (an S3 warehouse)."""
    return (spec.url, spec.warehouse, tuple(getattr(spec, "storage", ())))


class Worker:
    """A process that runs catalog operations for the test; ``spec`` says which catalog."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.pipe, child = _CTX.Pipe()
        self.proc = _CTX.Process(target=_main, args=(child, env or {}), daemon=True)
        self.proc.start()

    def _ask(self, *msg: Any, timeout: float = 120.0) -> Any:
        self.pipe.send(msg)
        return self.receive(timeout=timeout, what=msg[0])

    def receive(self, *, timeout: float = 120.0, what: str = "call") -> Any:
        if not self.pipe.poll(timeout):
            raise TimeoutError(f"worker {self.proc.pid} did not answer {what!r} in {timeout}s")
        reply = self.pipe.recv()
        if reply[0] == "error":
            raise WorkerError(reply[1], reply[2], reply[3])
        return reply[1]

    def prepare(self, spec: Any, op: str, table: str, *args: Any, key: tuple[str, int] | None = None,
                **kwargs: Any) -> None:
        self._ask("prepare", _where(spec), op, table, args, kwargs, key)

    def prepare_fn(self, spec: Any, module: str, func: str, *args: Any) -> None:
        self._ask("prepare_fn", _where(spec), module, func, args)

    def commit(self) -> list[dict[str, Any]]:
        return self._ask("commit")

    def abort(self) -> None:
        self._ask("abort")

    def call(self, spec: Any, module: str, func: str, *args: Any, timeout: float = 300.0) -> Any:
        return self._ask("call", _where(spec), module, func, args, timeout=timeout)

    def send_call(self, spec: Any, module: str, func: str, *args: Any) -> None:
        """Start a call without waiting; collect its answer with :meth:`receive`."""
        self.pipe.send(("call", _where(spec), module, func, args))

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.pipe.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def ping(cat: Any) -> str:
    return repr(cat)
