"""One Iceberg table's metadata as the publisher keeps and changes it.

An :class:`IcebergTable` holds the table's current ``TableMetadata`` (as the
SQL catalog's row names it) and, for its newest snapshot, the manifests and
their live entries, so that a new snapshot is built from the previous one and
the catalog's list of files added and removed, without reading a manifest:

1. **A draft** (:meth:`IcebergTable.draft`) collects the changes of one commit:
   schema updates, one or more snapshots (each: a manifest of the files it
   adds; every manifest that held a file it removes rewritten, the removed
   entries marked deleted; the others reused as they are; small manifests
   merged once there are more than :data:`MAX_MANIFESTS`), tags, the ``main``
   branch, expired tags and snapshots.
2. **Files first.** Manifests, manifest lists and the new ``metadata.json``
   are written under ``<location>/metadata/`` with fresh names before
   anything names them.
3. **Then the swap** (sqlcat.py): the catalog row moves from the old metadata
   file to the new one, or nothing happens (:class:`IcebergConflictError`) and
   the draft's files are deleted. A crash before the swap leaves only files no
   metadata names (the publisher's orphan sweep removes them).
4. **After the swap** the draft's state becomes the table's, and the files only
   expired snapshots named (manifest lists, manifests, delete files) and the
   metadata files that fell out of the metadata log are deleted.

Not guaranteed: an engine that loaded a metadata file before step 4 and reads
an expired snapshot afterwards finds its manifests gone (as with Iceberg's own
snapshot expiry).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, cast

from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table.metadata import TableMetadata, TableMetadataV2
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)

from .. import _failpoints
from .mapping import TableShape, file_uri

if TYPE_CHECKING:
    from ..catalog.storage import Storage

log = logging.getLogger(__name__)

#: Data (or delete) manifests a snapshot may list before the smaller ones are merged into one.
MAX_MANIFESTS = 16
#: Metadata files kept in the metadata log (``write.metadata.previous-versions-max``; older
#: ones are deleted after each commit, as ``write.metadata.delete-after-commit.enabled`` says).
METADATA_LOG = 20
#: DuckDB's and Spark's Avro readers take it; zstandard is not read everywhere
AVRO_CODEC: AvroCompressionCodec = "deflate"
BARRIER_KEY = "lakestep.barrier"
VERSION_KEY = "lakestep.version"
TAG_PREFIX = "barrier-"
NAME_MAPPING = "schema.name-mapping.default"


def summary_version(summary: Summary | None) -> int | None:
    """The lakestep version a snapshot's summary names (``lakestep.version``)."""
    v = None if summary is None else summary.additional_properties.get(VERSION_KEY)
    return None if v is None else int(v)


def tag_name(barrier: int) -> str:
    return f"{TAG_PREFIX}{barrier}"


def tag_barrier(name: str) -> int | None:
    if not name.startswith(TAG_PREFIX):
        return None
    try:
        return int(name[len(TAG_PREFIX):])
    except ValueError:
        return None


class StorageFileIO(PyArrowFileIO):
    """PyIceberg's Arrow FileIO on lakestep's filesystems: object stores are reached with the
    catalog's storage options and the same filesystem cache as lakestep's own files."""

    def __init__(self, storage: "Storage") -> None:
        self.storage = storage
        super().__init__()

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> Any:
        if scheme in ("s3", "s3a", "s3n"):
            return self.storage.filesystem(f"s3://{netloc}")[0]
        return super()._initialize_fs(scheme, netloc)


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (PyIceberg writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


@dataclass
class Entry:
    """A live file of the newest snapshot, as its manifest records it."""

    file: DataFile
    snapshot_id: int
    seq: int  # data sequence number
    file_seq: int


@dataclass
class Manifest:
    file: ManifestFile  # with its sequence numbers assigned
    entries: dict[str, Entry]  # live entries by file path

    @property
    def content(self) -> ManifestContent:
        return self.file.content


@dataclass
class State:
    """The newest snapshot's manifests, and what each retained snapshot names."""

    head: int | None = None  # the newest snapshot (highest sequence number)
    manifests: list[Manifest] = field(default_factory=list)
    # per snapshot: its manifest list and manifests, and the delete files its manifests list
    names: dict[int, set[str]] = field(default_factory=dict)

    def live(self, content: ManifestContent = ManifestContent.DATA) -> dict[str, Entry]:
        out: dict[str, Entry] = {}
        for m in self.manifests:
            if m.content == content:
                out.update(m.entries)
        return out

    def copy(self) -> "State":
        return State(self.head, list(self.manifests), dict(self.names))


class IcebergTable:
    """A published Iceberg table: its metadata, metadata file and newest snapshot's entries."""

    def __init__(self, namespace: str, name: str, metadata: TableMetadata, metadata_location: str,
                 io: PyArrowFileIO, state: State) -> None:
        self.namespace = namespace
        self.name = name
        self.metadata = metadata
        self.metadata_location = metadata_location
        self.io = io
        self.state = state

    @property
    def ident(self) -> str:
        return f"{self.namespace}.{self.name}"

    # --------------------------------------------------------------- open
    @classmethod
    def new(cls, namespace: str, name: str, location: str, shape: TableShape, io: PyArrowFileIO,
            properties: Mapping[str, str]) -> "IcebergTable":
        """A table with no snapshot yet (registered by the first commit of its draft)."""
        md = TableMetadataV2(
            location=file_uri(location, ""), table_uuid=uuid.uuid4(), last_updated_ms=_now_ms(),
            last_column_id=shape.last_column_id, schemas=[shape.schema], current_schema_id=shape.schema.schema_id,
            partition_specs=[shape.spec], default_spec_id=shape.spec.spec_id,
            last_partition_id=max([999, *[f.field_id for f in shape.spec.fields]]),
            properties={**properties, NAME_MAPPING: shape.name_mapping,
                        "write.metadata.previous-versions-max": str(METADATA_LOG),
                        "write.metadata.delete-after-commit.enabled": "true"}, sort_orders=[UNSORTED_SORT_ORDER],
            default_sort_order_id=UNSORTED_SORT_ORDER.order_id)
        return cls(namespace, name, md, "", io, State())

    @classmethod
    def load(cls, namespace: str, name: str, metadata_location: str, io: PyArrowFileIO) -> "IcebergTable":
        """Read a published table back (a publisher starting): its metadata, the newest
        snapshot's manifests and entries, and the files every snapshot names."""
        md = FromInputFile.table_metadata(io.new_input(metadata_location))
        state = State()
        snaps = sorted(md.snapshots, key=lambda s: s.sequence_number or 0)
        for s in snaps:
            files = s.manifests(io)
            names = {s.manifest_list, *(m.manifest_path for m in files)}
            for m in files:
                if m.content == ManifestContent.DELETES:
                    names.update(e.data_file.file_path for e in m.fetch_manifest_entry(io, discard_deleted=True))
            state.names[s.snapshot_id] = names
        if snaps:
            head = snaps[-1]
            state.head = head.snapshot_id
            for m in head.manifests(io):
                entries = {e.data_file.file_path: Entry(e.data_file, int(e.snapshot_id or 0), int(e.sequence_number or 0),
                                                        int(e.file_sequence_number or 0))
                           for e in m.fetch_manifest_entry(io, discard_deleted=True)}
                state.manifests.append(Manifest(m, entries))
        return cls(namespace, name, md, metadata_location, io, state)

    # ------------------------------------------------------------ reading
    def tags(self) -> dict[int, int]:
        """barrier -> snapshot id of every ``barrier-N`` tag."""
        out = {}
        for name, ref in self.metadata.refs.items():
            b = tag_barrier(name)
            if b is not None and ref.snapshot_ref_type == SnapshotRefType.TAG:
                out[b] = ref.snapshot_id
        return out

    def version_of(self, snapshot_id: int | None) -> int | None:
        s = None if snapshot_id is None else self.metadata.snapshot_by_id(snapshot_id)
        return None if s is None else summary_version(s.summary)

    def head_version(self) -> int | None:
        return self.version_of(self.state.head)

    def draft(self) -> "Draft":
        return Draft(self)

    def referenced(self) -> set[str]:
        """Every file the current metadata names (metadata files of its log included)."""
        out = {self.metadata_location, *(e.metadata_file for e in self.metadata.metadata_log)}
        for names in self.state.names.values():
            out |= names
        return out


def _now_ms() -> int:
    return int(time.time() * 1000)


class Draft:
    """The changes of one commit of one table (module docstring, steps 1-4)."""

    def __init__(self, table: IcebergTable) -> None:
        self.table = table
        self.io = table.io
        self.base = table.metadata
        self.updates: list[TableUpdate] = []
        self.state = table.state.copy()
        self.written: list[str] = []  # files this draft wrote (deleted if it does not land)
        self.expired: set[int] = set()
        self.commit_uuid = uuid.uuid4()
        self._counter = itertools.count()
        self.schema: Schema = self.base.schema()
        self.spec: PartitionSpec = self.base.spec()
        # lakestep publishes format v2 only (IcebergTable.new), which has sequence numbers (v1 has not)
        self.last_seq = cast(TableMetadataV2, self.base).last_sequence_number
        self.snapshot_ids = {s.snapshot_id for s in self.base.snapshots}
        self.refs = {k: r.snapshot_id for k, r in self.base.refs.items()}
        self.summaries: dict[int, Summary | None] = {s.snapshot_id: s.summary for s in self.base.snapshots}

    # -------------------------------------------------------------- schema
    def set_shape(self, shape: TableShape) -> None:
        """A new schema (lakestep added columns): published as an Iceberg schema update, with the
        name mapping that names the new fields."""
        if shape.schema.as_struct() == self.schema.as_struct() and \
                self.base.properties.get(NAME_MAPPING) == shape.name_mapping:
            return
        sid = max(s.schema_id for s in self.base.schemas) + 1
        new = Schema(*shape.schema.fields, schema_id=sid, identifier_field_ids=shape.schema.identifier_field_ids)
        self.updates += [AddSchemaUpdate(schema_=new), SetCurrentSchemaUpdate(schema_id=-1),
                         SetPropertiesUpdate(updates={NAME_MAPPING: shape.name_mapping})]
        self.schema = new

    # ------------------------------------------------------------ snapshots
    def _path(self, suffix: str) -> str:
        return f"{self.base.location.rstrip('/')}/metadata/{suffix}"

    def _output(self, suffix: str) -> Any:
        path = self._path(suffix)
        self.written.append(path)
        return self.io.new_output(path)

    def _new_snapshot_id(self) -> int:
        while True:
            sid = uuid.uuid4().int & ((1 << 63) - 1)
            if sid and sid not in self.snapshot_ids:
                self.snapshot_ids.add(sid)
                return sid

    def _manifest(self, sid: int, entries: Iterable[ManifestEntry], content: ManifestContent) -> ManifestFile:
        out = self._output(f"{self.commit_uuid}-m{next(self._counter)}.avro")
        writer: ManifestWriter
        if content == ManifestContent.DELETES:
            writer = _DeleteManifestWriter(self.spec, self.schema, out, sid, AVRO_CODEC)
        else:
            writer = write_manifest(2, self.spec, self.schema, out, sid, AVRO_CODEC)
        with writer:
            for e in entries:
                writer.add_entry(e)
        return writer.to_manifest_file()

    def snapshot(self, *, version: int, barrier: int | None, operation: Operation,
                 added: Sequence[DataFile] = (), removed: Iterable[str] = (),
                 added_deletes: Sequence[DataFile] = (), removed_deletes: Iterable[str] = ()) -> int:
        """A new snapshot on top of the newest one: ``added`` and ``removed`` (file paths) data
        files, ``added_deletes`` / ``removed_deletes`` position-delete files. Returns its id."""
        sid = self._new_snapshot_id()
        seq = self.last_seq + 1
        parent = self.state.head
        gone = {ManifestContent.DATA: set(removed), ManifestContent.DELETES: set(removed_deletes)}
        fresh = {ManifestContent.DATA: list(added), ManifestContent.DELETES: list(added_deletes)}
        removed_files: list[DataFile] = []
        out: list[tuple[ManifestFile, dict[str, Entry]]] = []
        for content in (ManifestContent.DATA, ManifestContent.DELETES):
            mine: list[tuple[ManifestFile, dict[str, Entry]]] = []
            news = fresh[content]
            if news:
                mf = self._manifest(sid, (ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=sid, sequence_number=None, file_sequence_number=None,
                    data_file=f) for f in news), content)
                mine.append((mf, {f.file_path: Entry(f, sid, seq, seq) for f in news}))
            kept: list[Manifest] = []
            for m in self.state.manifests:
                if m.content != content:
                    continue
                hit = gone[content].intersection(m.entries)
                if not hit:
                    kept.append(m)
                    continue
                rest = {p: e for p, e in m.entries.items() if p not in hit}
                removed_files += [m.entries[p].file for p in hit]
                entries = [ManifestEntry.from_args(status=ManifestEntryStatus.EXISTING, snapshot_id=e.snapshot_id,
                                                   sequence_number=e.seq, file_sequence_number=e.file_seq,
                                                   data_file=e.file) for e in rest.values()]
                entries += [ManifestEntry.from_args(status=ManifestEntryStatus.DELETED, snapshot_id=sid,
                                                    sequence_number=m.entries[p].seq,
                                                    file_sequence_number=m.entries[p].file_seq,
                                                    data_file=m.entries[p].file) for p in sorted(hit)]
                mine.append((self._manifest(sid, entries, content), rest))
            kept = [m for m in kept if m.entries]
            if len(kept) + len(mine) > MAX_MANIFESTS:  # merge the small ones
                kept.sort(key=lambda m: len(m.entries))
                merge, kept = kept[:len(kept) // 2 + 1], kept[len(kept) // 2 + 1:]
                entries = [ManifestEntry.from_args(status=ManifestEntryStatus.EXISTING, snapshot_id=e.snapshot_id,
                                                   sequence_number=e.seq, file_sequence_number=e.file_seq,
                                                   data_file=e.file) for m in merge for e in m.entries.values()]
                if entries:
                    mine.append((self._manifest(sid, entries, content),
                                 {p: e for m in merge for p, e in m.entries.items()}))
            out += mine + [(m.file, m.entries) for m in kept]
        list_path = self._path(f"snap-{sid}-0-{self.commit_uuid}.avro")
        self.written.append(list_path)
        files = [mf for mf, _ in out]
        with write_manifest_list(2, self.io.new_output(list_path), sid, parent, seq, AVRO_CODEC) as w:
            w.add_manifests(files)
        manifests = []
        for mf, live in out:
            if mf.sequence_number == -1:
                mf.sequence_number = seq
            if mf.min_sequence_number == -1:
                mf.min_sequence_number = seq
            manifests.append(Manifest(mf, {p: e for p, e in live.items() if p not in gone[mf.content]}))
        summary = self._summary(operation, version, barrier, parent, fresh, removed_files)
        snap = Snapshot(snapshot_id=sid, parent_snapshot_id=parent, sequence_number=seq, timestamp_ms=_now_ms(),
                        manifest_list=list_path, summary=summary, schema_id=self.schema.schema_id)
        self.updates.append(AddSnapshotUpdate(snapshot=snap))
        self.summaries[sid] = summary
        names = {list_path, *(m.file.manifest_path for m in manifests)}
        names.update(p for m in manifests if m.content == ManifestContent.DELETES for p in m.entries)
        self.state = State(sid, manifests, {**self.state.names, sid: names})
        self.last_seq = seq
        return sid

    def _summary(self, operation: Operation, version: int, barrier: int | None, parent: int | None,
                 fresh: Mapping[ManifestContent, list[DataFile]], removed: list[DataFile]) -> Summary:
        ssc = SnapshotSummaryCollector()
        for files in fresh.values():
            for f in files:
                ssc.add_file(f, self.schema, self.spec)
        for f in removed:
            ssc.remove_file(f, self.schema, self.spec)
        props = {VERSION_KEY: str(version)}
        if barrier is not None:
            props[BARRIER_KEY] = str(barrier)
        base_op = operation if operation in (Operation.APPEND, Operation.OVERWRITE, Operation.DELETE) \
            else Operation.OVERWRITE
        prev = self.summaries.get(parent) if parent is not None else None
        s = update_snapshot_summaries(Summary(base_op, **ssc.build(), **props),
                                      previous_summary=prev.additional_properties if prev is not None else None)
        return s if base_op == operation else Summary(operation, **s.additional_properties)

    # ----------------------------------------------------------------- refs
    # SetSnapshotRefUpdate's retention fields (max_ref_age_ms, ...) default to None, in
    # Annotated[..., Field(default=None)], which pydantic's mypy plugin takes for required
    # (pydantic/pydantic#6713): hence the ignores below.
    def tag(self, barrier: int, snapshot_id: int) -> None:
        name = tag_name(barrier)
        self.updates.append(SetSnapshotRefUpdate(  # type: ignore[call-arg]
            ref_name=name, type=SnapshotRefType.TAG, snapshot_id=snapshot_id))
        self.refs[name] = snapshot_id

    def main(self, snapshot_id: int) -> None:
        if self.refs.get(MAIN_BRANCH) == snapshot_id:
            return
        self.updates.append(SetSnapshotRefUpdate(  # type: ignore[call-arg]
            ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id))
        self.refs[MAIN_BRANCH] = snapshot_id

    def remove_ref(self, name: str) -> None:
        if name in self.refs:
            self.updates.append(RemoveSnapshotRefUpdate(ref_name=name))
            del self.refs[name]

    def expire(self, snapshot_ids: Iterable[int]) -> None:
        """Remove snapshots (never the newest, on which the next one builds)."""
        ids = sorted(set(snapshot_ids) - {self.state.head} - self.expired)
        if ids:
            self.updates.append(RemoveSnapshotsUpdate(snapshot_ids=ids))
            self.expired.update(ids)

    @property
    def changed(self) -> bool:
        """Anything to commit (a table never committed is created, empty, by its first commit)."""
        return bool(self.updates) or not self.table.metadata_location

    # --------------------------------------------------------------- commit
    def write(self) -> str:
        """Step 2: write the new metadata file (every other file is written already); returns
        its location. Nothing names it until :meth:`finish` follows a swap."""
        t = self.table
        self.md = _apply(self.base, self.updates, t.metadata_location or None)
        n = _metadata_number(t.metadata_location) + 1
        self.location = self._path(f"{n:05d}-{uuid.uuid4()}.metadata.json")
        self.written.append(self.location)
        try:
            ToOutputFile.table_metadata(self.md, self.io.new_output(self.location))
        except BaseException:
            self.discard()
            raise
        _failpoints.hit("publish.table.written")  # every file written, nothing swapped
        return self.location

    def finish(self) -> None:
        """Step 4, after the swap made :meth:`write`'s file the table's: the table takes the
        draft's state, and the files only expired snapshots and old metadata named are deleted."""
        t = self.table
        _failpoints.hit("publish.table.swapped")  # visible; the old files not deleted yet
        before = t.referenced()
        for sid in self.expired:
            self.state.names.pop(sid, None)
        t.metadata, t.metadata_location, t.state = self.md, self.location, self.state
        self.written.clear()
        for path in sorted(before - t.referenced()):
            _delete(self.io, path)

    def discard(self) -> None:
        """Delete the files of a draft that did not land (best effort)."""
        for path in self.written:
            _delete(self.io, path)
        self.written.clear()


def _apply(base: TableMetadata, updates: Sequence[TableUpdate], metadata_location: str | None) -> TableMetadata:
    """PyIceberg's ``update_table_metadata`` without its final deep copy of the whole metadata
    (each update already makes new objects where it changes something; the copy cost about
    10 ms a commit with a hundred snapshots and grew with them). Relies on PyIceberg's
    per-update functions, hence the pinned minor version of the ``iceberg`` extra."""
    from pyiceberg.table.update import (
        _apply_table_update,
        _TableMetadataUpdateContext,
        _update_table_metadata_log,
    )

    context = _TableMetadataUpdateContext()
    md = base
    for u in updates:
        md = _apply_table_update(u, md, context)
    if context.has_changes():
        if metadata_location:
            md = _update_table_metadata_log(md, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == md.last_updated_ms:
            md = md.model_copy(update={"last_updated_ms": _now_ms()})
    md.spec().check_compatible(md.schema())
    return md


def _metadata_number(location: str) -> int:
    name = location.rsplit("/", 1)[-1]
    try:
        return int(name.split("-", 1)[0])
    except ValueError:
        return 0


def _delete(io: PyArrowFileIO, path: str) -> None:
    try:
        io.delete(path)
    except FileNotFoundError:
        pass
    except OSError as e:  # left for the orphan sweep
        log.debug("could not delete %s: %s", path, e)


def delete_file_entry(path: str, size: int, rows: int, partition: Any, spec_id: int, data_path: str) -> DataFile:
    """The manifest entry of a position-delete file naming the rows of one data file."""
    from pyiceberg.conversions import to_bytes
    from pyiceberg.types import StringType

    bound = to_bytes(StringType(), data_path)
    df = DataFile.from_args(content=DataFileContent.POSITION_DELETES, file_path=path, file_format=FileFormat.PARQUET,
                            partition=partition, record_count=rows, file_size_in_bytes=size,
                            lower_bounds={FILE_PATH_ID: bound}, upper_bounds={FILE_PATH_ID: bound})
    df.spec_id = spec_id
    return df


FILE_PATH_ID = 2147483546  # Iceberg's reserved field ids of a position-delete file
POS_ID = 2147483545
