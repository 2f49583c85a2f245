"""What a publish round reports (publisher.py): :class:`PublishReport`, a :class:`TableReport` per table."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TableReport:
    """What one round did to one table."""

    snapshots: int = 0
    tags: list[int] = field(default_factory=list)
    removed_tags: list[int] = field(default_factory=list)
    main: int | None = None  # the version main shows after the round
    expired: int = 0
    error: str | None = None


@dataclass
class PublishReport:
    """One round (publisher.py's module docstring)."""

    leader: bool
    holder: str | None = None  # who holds the lease when this publisher did not
    barriers: list[int] = field(default_factory=list)
    complete: int | None = None  # the complete cut after the round
    tables: dict[str, TableReport] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def errors(self) -> dict[str, str]:
        return {t: r.error for t, r in self.tables.items() if r.error}
