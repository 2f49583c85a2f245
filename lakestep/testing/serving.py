"""An ASGI app served by uvicorn on a free loopback port, in a thread of this process:
how the tests and ``benchmarks/serve.py`` run ``lakestep serve``'s app without a
subprocess (tests/serve/test_command.py runs the command itself).

Needs the ``serve`` extra (uvicorn)."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..errors import ServerStartError
from .ports import free_port


class Served:
    """A running server for ``app``: :attr:`uri` (``http://127.0.0.1:<port>``), :meth:`stop`.
    A context manager; startup waits on uvicorn's ``started`` flag, not on a sleep."""

    def __init__(self, app: Any, *, timeout: float = 60.0, name: str = "lakestep-serve") -> None:
        import uvicorn

        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise ServerStartError("the server thread ended before it listened")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"the server did not listen within {timeout} s")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        if self.thread.is_alive():
            raise ServerStartError("the server thread did not stop within 30 s")

    def __enter__(self) -> "Served":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
