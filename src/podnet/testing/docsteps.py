"""The runnable steps of a page in ``docs/``: tests run the documented commands as written.

A step is a fenced ``sh`` block right after a ``<!-- test: NAME -->`` line. ``steps``
returns the blocks of one name in page order; ``run_step`` runs them with bash
(``set -euo pipefail``) and the variables the page tells the reader to set, so a page
whose commands no longer work fails its test.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

DOCS = Path(__file__).resolve().parents[3] / "docs"
_MARK = re.compile(r"^<!-- test: ([a-z0-9-]+) -->$")


def steps(page: Path, name: str) -> list[str]:
    """The ``sh`` blocks marked ``<!-- test: name -->`` in ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[str] = []
    for i, line in enumerate(lines):
        mark = _MARK.match(line.strip())
        if mark is None or mark.group(1) != name:
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
            raise ValueError(f"{page}:{i + 1}: a test mark must be followed by a ```sh block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{i + 2}: the ```sh block is not closed")
        found.append("\n".join(lines[i + 2 : end]) + "\n")
    if not found:
        raise ValueError(f"{page} has no step named {name!r}")
    return found


def run_step(
    page: Path, name: str, variables: Mapping[str, str], timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run the blocks ``name`` of ``page`` in one bash, with ``variables`` set; raise
    with bash's output when it fails."""
    script = "set -euo pipefail\n" + "".join(steps(page, name))
    env = {**os.environ, **variables}
    result = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise AssertionError(
            f"step {name!r} of {page.name} failed ({result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result
