"""The streaming modules renamed in issue 33 stay importable under their old paths for one
release: each old module warns (DeprecationWarning) and re-exports its replacement's objects."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {
    "lakestep.streaming.progress": {
        "lakestep.streaming.microbatch": ["commit_batch", "ensure_sink_registered", "ensure_source_registered"],
        "lakestep.streaming.catalog_cache": ["open_catalog", "required", "storage_of"],
    },
    "lakestep.streaming.batch": {
        "lakestep.streaming.batch_io": ["LakestepBatchReader", "LakestepBatchWriter", "PlanPartition", "read_plan",
                                        "write_barrier"],
    },
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_reexports(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=r"removed in 0\.3\.0"):
        shim = importlib.import_module(old)
    for new, names in MOVED[old].items():
        module = importlib.import_module(new)
        for name in names:
            assert getattr(shim, name) is getattr(module, name), f"{old}.{name}"
    assert sorted(shim.__all__) == sorted(n for names in MOVED[old].values() for n in names)
