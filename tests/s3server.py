"""A real S3-protocol server for the tests: moto's standalone server in its own process.

    python -m tests.s3server          # prints "PORT <n>" once it listens on 127.0.0.1:<n>

moto's server application (the one ``moto_server`` and ``ThreadedMotoServer``
run) is served by werkzeug on a free port of 127.0.0.1, in a process of its
own, so that the store answers the test process, its worker processes and
Spark's executors alike, and its Python does not compete with the tests' for
one GIL. In front of it a small WSGI layer records every S3 request (method,
path, query, whether it copies an object), so that a test can say exactly
what lakestep asked the store to do; ``GET /__lakestep__/requests?since=N``
returns the records from the N-th on, ``.../count`` how many there are. (Bucket names cannot hold ``_``: no
bucket request can take that path.)

:class:`S3Server` is the test side: it starts the process, reads the log, and
knows what a listing and a copy (S3's only way to "rename") look like on the
wire.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs
from urllib.request import urlopen

ACCESS_KEY = "lakestep-test-key"
SECRET_KEY = "lakestep-test-secret"
REGION = "us-east-1"
_CONTROL = "/__lakestep__/requests"


# ------------------------------------------------------------------ the server
class _Recorder:
    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == _CONTROL + "/count":
            with self.lock:
                body = str(len(self.log)).encode()
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]
        if path == _CONTROL:
            since = int(parse_qs(environ.get("QUERY_STRING", "")).get("since", ["0"])[0])
            with self.lock:
                body = json.dumps(self.log[since:]).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        with self.lock:
            self.log.append({"method": environ.get("REQUEST_METHOD", ""), "path": path,
                             "query": environ.get("QUERY_STRING", ""),
                             "copy": "HTTP_X_AMZ_COPY_SOURCE" in environ})
        return self.app(environ, start_response)


def serve() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = _Recorder(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"PORT {server.server_port}", flush=True)
    server.serve_forever()


# -------------------------------------------------------------- the test side
@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    copy: bool

    @property
    def bucket_level(self) -> bool:
        return self.path.strip("/").count("/") == 0

    @property
    def is_list(self) -> bool:
        """ListObjects(V2) or ListMultipartUploads: a GET of the bucket itself."""
        return self.method == "GET" and self.bucket_level and "location" not in parse_qs(self.query)

    @property
    def is_copy(self) -> bool:
        """CopyObject / UploadPartCopy: all S3 has instead of a rename."""
        return self.copy

    def __str__(self) -> str:
        return f"{self.method} {self.path}{'?' + self.query if self.query else ''}{' (copy)' if self.copy else ''}"


class S3Server:
    """The server process (started by the ``s3_server`` fixture) and its request log."""

    def __init__(self) -> None:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.s3server"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=root)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()  # blocks until the server listens (or dies)
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"the S3 server did not start (exit {self.proc.wait()}): {line!r}")
        self.port = int(line.split()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def options(self) -> dict[str, str]:
        """Storage options that reach this server (``Catalog(storage_options=...)``)."""
        return {"endpoint_override": self.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
                "region": REGION}

    def env(self) -> dict[str, str]:
        """The standard AWS environment variables that reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def filesystem(self) -> Any:
        """pyarrow's S3 filesystem on this server, made here (not through lakestep)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=self.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                                 region=REGION, allow_bucket_creation=True)

    def new_bucket(self) -> str:
        name = f"lakestep-{uuid.uuid4().hex[:16]}"
        self.filesystem().create_dir(name)
        return name

    def requests(self, since: int = 0) -> list[Request]:
        with urlopen(f"{self.endpoint}{_CONTROL}?since={since}", timeout=30) as r:
            return [Request(**d) for d in json.loads(r.read())]

    def mark(self) -> int:
        """The position in the log now: ``requests(since=mark)`` is what came after."""
        with urlopen(f"{self.endpoint}{_CONTROL}/count", timeout=30) as r:
            return int(r.read())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def summary(requests: Iterable[Request]) -> str:
    return "; ".join(map(str, requests))


if __name__ == "__main__":
    serve()
