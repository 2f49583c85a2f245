"""Where data files live and how they are reached: locations and storage.

Table and warehouse locations are absolute paths or URIs (:func:`normalize_location`);
data file paths are stored relative to their table's location
(:func:`check_relative_path`). :class:`Storage` holds the options of an object-store
warehouse and opens pyarrow's filesystems (one per process and configuration);
:func:`storage_error` says what a failed write means and what to do about it.

Only this module, the writer (``writer.py``) and the readers touch the filesystem;
nothing here talks to the catalog database, so executors use it too.
"""

from __future__ import annotations

import errno as errnos
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InvalidArgumentError, InvalidLocationError, StorageError


# ------------------------------------------------------------------ locations
def normalize_location(location: str) -> str:
    """A canonical form of a table or warehouse location: absolute path or URI."""
    if not isinstance(location, str) or not location.strip():
        raise InvalidLocationError(f"location must be a non-empty string, got {location!r}", location=str(location))
    if "\x00" in location:
        raise InvalidLocationError("location contains a NUL byte", location=location)
    if "://" in location:
        scheme, rest = location.split("://", 1)
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*$", scheme):
            raise InvalidLocationError(f"malformed URI scheme in {location!r}", location=location)
        if scheme == "file":
            return os.path.normpath(rest)
        parts = rest.split("/")
        if any(p == ".." for p in parts):
            raise InvalidLocationError(f"location {location!r} must not contain '..'", location=location)
        return f"{scheme}://" + "/".join(p for i, p in enumerate(parts) if p or i == 0).rstrip("/")
    return os.path.normpath(os.path.abspath(location))


def file_uri(location: str, rel: str) -> str:
    """The absolute URI (or local path) of the file ``rel`` of the table at ``location``."""
    check_relative_path(rel)
    if "://" in location:
        return location.rstrip("/") + "/" + rel
    return os.path.join(location, *rel.split("/"))


# ------------------------------------------------------------------- storage
# The options of pyarrow's S3FileSystem a catalog may be given (``storage_options``,
# or Spark options ``storage.<name>``), and how each is parsed from a string.
S3_OPTIONS: dict[str, type] = {
    "access_key": str, "secret_key": str, "session_token": str, "region": str, "endpoint_override": str,
    "scheme": str, "force_virtual_addressing": bool, "connect_timeout": float, "request_timeout": float,
}
SECRET_OPTIONS = frozenset({"access_key", "secret_key", "session_token"})
# The AWS environment variables lakestep or the AWS SDK inside pyarrow read: filesystems
# are cached per their values too.
_AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED")


def _option_value(name: str, value: object) -> object:
    kind = S3_OPTIONS[name]
    if kind is bool:
        if isinstance(value, bool):
            return value
        v = str(value).strip().lower()
        if v not in ("true", "false"):
            raise InvalidArgumentError(f"storage option {name} must be true or false, got {value!r}",
                                       argument=name, value=value)
        return v == "true"
    if kind is float:
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"storage option {name} must be a number of seconds, got {value!r}",
                                       argument=name, value=value) from None
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"storage option {name} must be a non-empty string",
                                   argument=name, value="***" if name in SECRET_OPTIONS else value)
    return value


@dataclass(frozen=True)
class Storage:
    """How to reach an object-store warehouse: options of pyarrow's ``S3FileSystem``.

    Empty (the default) means the standard AWS environment variables
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
    ``AWS_REGION``, ``AWS_ENDPOINT_URL``), the AWS config files and instance
    roles. Given options win over the environment for what they name. A
    Storage is small and picklable: the driver hands it to Spark executors
    with each table's shape and read plan, so executors reach the store
    exactly as the driver does without ever talking to the catalog database.
    Its repr never shows a credential.
    """

    options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, options: "Mapping[str, object] | Storage | None") -> "Storage":
        if isinstance(options, Storage):
            return options
        unknown = sorted(set(options or {}) - set(S3_OPTIONS))
        if unknown:
            raise InvalidArgumentError(f"unknown storage option(s) {unknown}; known: {sorted(S3_OPTIONS)}",
                                       argument="storage_options", value=unknown)
        return cls(tuple(sorted((k, _option_value(k, v)) for k, v in (options or {}).items())))

    def as_dict(self) -> dict[str, object]:
        return dict(self.options)

    def spark_options(self) -> dict[str, str]:
        """The options as a Spark data source takes them (``storage.<name>``); they hold credentials."""
        return {f"storage.{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.options}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'***' if k in SECRET_OPTIONS else repr(v)}" for k, v in self.options)
        return f"Storage({shown})"

    __str__ = __repr__

    def filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """The pyarrow filesystem and the path inside it for a normalized ``location``.

        One filesystem per process and configuration (an S3 client is costly to
        make, and may ask the store for the bucket's region)."""
        if "://" not in location:
            return pafs.LocalFileSystem(), location
        scheme, rest = location.split("://", 1)
        if scheme != "s3":
            if self.options:
                raise InvalidLocationError(f"storage options apply to s3:// locations, not {location!r}",
                                           location=location)
            return _from_uri(location)
        env = tuple(os.environ.get(k) for k in _AWS_ENV)
        bucket = rest.split("/", 1)[0]
        key = (self.options, env, bucket)
        with _fs_lock:
            fs = _filesystems.get(key)
        if fs is None:
            fs = _s3(self.as_dict(), bucket, location)
            with _fs_lock:
                fs = _filesystems.setdefault(key, fs)
        return fs, rest.rstrip("/")


_filesystems: dict[tuple[Any, ...], pafs.FileSystem] = {}
_fs_lock = threading.Lock()


def _from_uri(location: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(location)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidLocationError(f"pyarrow cannot open {location!r}: {e}", location=location) from e


def _s3(options: dict[str, object], bucket: str, location: str) -> pafs.FileSystem:
    """pyarrow's S3 filesystem: the options, then the AWS environment for what they leave out.

    The endpoint comes from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (pyarrow's
    constructor reads neither), the region from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
    else AWS is asked where the bucket lives; credentials are left to the AWS SDK's
    chain (variables, config files, instance roles). Writes open lazily
    (``allow_delayed_open``): a small file is one PUT, not a three-request multipart upload.
    """
    opts = dict(options)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if "endpoint_override" not in opts and endpoint:
        opts["endpoint_override"] = endpoint
    if "region" not in opts:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            opts["region"] = region
        elif "endpoint_override" not in opts:
            try:
                opts["region"] = pafs.resolve_s3_region(bucket)
            except OSError as e:
                raise StorageError(f"cannot ask AWS for the region of bucket {bucket!r} (set AWS_REGION or the "
                                   f"storage option region): {e}", path=location, errno=None) from e
    try:
        return pafs.S3FileSystem(allow_delayed_open=True, **opts)
    except (pa.ArrowInvalid, TypeError) as e:
        raise InvalidLocationError(f"pyarrow cannot open {location!r} with these storage options: {e}",
                                   location=location) from e


def resolve_filesystem(location: str, storage: "Storage | None" = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the path inside it for a normalized location."""
    return (storage or Storage()).filesystem(location)


def is_object_store(location: str) -> bool:
    """Everything but the local disk: no atomic rename, no directories, slow listings."""
    return "://" in location


def check_relative_path(path: str) -> str:
    """Data file paths are stored relative to the table location; refuse escapes."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise InvalidLocationError(f"bad data file path {path!r}", location=path)
    if any(p in ("", ".", "..") for p in path.split("/")):
        raise InvalidLocationError(f"data file path {path!r} must not contain '.', '..' or '//'", location=path)
    return path


_FULL = {errnos.ENOSPC, getattr(errnos, "EDQUOT", -1), errnos.EFBIG}
_READ_ONLY = {errnos.EROFS, errnos.EACCES, errnos.EPERM}


def storage_error(e: OSError, path: str, doing: str) -> StorageError:
    """A :class:`StorageError` for ``e``, whose message says what to do about it."""
    code = e.errno
    if code in _FULL:
        what = ("the storage is full or the file exceeds a size limit" if code == errnos.EFBIG
                else "the storage is full (no space left, or over quota)")
        todo = "free space or raise the quota, or move the warehouse to larger storage, then retry"
    elif code in _READ_ONLY:
        what = "the directory is read-only or not writable by this process"
        todo = "make it writable for this user, or choose another location or warehouse"
    elif code in (errnos.ENOTDIR, errnos.EEXIST):
        what = "a file stands where a directory is needed"
        todo = "move that file away, or choose another location"
    else:
        what = "the storage refused the write"
        todo = "check the storage and retry"
    return StorageError(f"{doing} at {path!r} failed: {what} ({e}). Nothing was committed; {todo}",
                        path=path, errno=code)
