"""A free TCP port, the one way the tests, the benchmarks and :mod:`lakestep.testing` pick one."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that nothing listens on now (the OS picks it: bind to port 0).

    Not guaranteed: the port is free when this returns, not when the caller binds it;
    another process may take it in between (a caller that must have it retries, or lets
    its server bind port 0 itself and reports the port).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
