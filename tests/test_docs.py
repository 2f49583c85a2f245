"""The README's examples (and docs/iceberg.md's) run as written, and the demo runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "iceberg.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "not run by the doc test" not in b]
    assert blocks
    # each block twice, as a script in a fresh process and then again in that process, over what the
    # first run left on disk: examples must be re-runnable (exist_ok, idempotent keys)
    twice = "import runpy, sys\nfor run in (1, 2):\n    print(f'run {run}', file=sys.stderr)\n" \
            "    runpy.run_path(sys.argv[1], run_name='__main__')\n"
    for i, code in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(code)
        proc = subprocess.run([sys.executable, "-c", twice, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"README block {i} failed:\n{code}\n{proc.stderr}"
        assert "run 2" in proc.stderr


def test_demo_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "examples.demo"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "history of shop.orders" in proc.stdout and "COMPACT" in proc.stdout


def test_design_citations_point_at_existing_sections() -> None:
    """Code and docs cite ``docs/design.md §N``: each section exists, and nothing cites a file outside the repo."""
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (ROOT / "docs" / "design.md").read_text(), flags=re.M))
    cited: set[str] = set()
    outside = ("../" + "shared", "DESIGN" + ".md")  # spelled apart so that this file passes its own check
    for path in [*ROOT.glob("lakestep/**/*.py"), *ROOT.glob("tests/**/*.py"), ROOT / "README.md"]:
        text = path.read_text()
        assert not any(o in text for o in outside), f"{path} cites a design file outside the repo"
        cited |= set(re.findall(r"docs/design\.md §(\d+(?:\.\d+)?)", text))
    assert cited, "nothing cites docs/design.md"
    assert cited <= headings, f"cited sections missing from docs/design.md: {sorted(cited - headings)}"
