"""A pod's private /tmp and a podnet installed below /tmp (found by a clean clone under
/tmp: every pod's command exited at once, its Python hidden by the pod's own tmpfs).

The mounts run in a child process with a mount namespace of its own (``unshare``), so
nothing changes on the host."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.testing import tools

pytestmark = [pytest.mark.root]

CHILD = """
import sys
from pathlib import Path
from podnet.cluster.sandboxmounts import private_tmpfs
tmp, kept, other = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
private_tmpfs([tmp], keep=[kept])
print((kept / "python").read_text(), other.exists(), sorted(p.name for p in tmp.iterdir()))
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory of this test's own under /tmp, removed afterwards."""
    root = Path("/tmp") / f"pn-sbx-{uuid.uuid4().hex[:8]}"
    (root / "venv").mkdir(parents=True)
    try:
        yield root
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


def test_the_python_below_tmp_stays_visible_and_nothing_else_of_tmp(scratch: Path) -> None:
    unshare = tools.require("unshare")
    (scratch / "venv" / "python").write_text("interpreter")
    (scratch / "secret").write_text("another tenant's file")
    argv = [unshare, "--mount", "--propagation", "private", sys.executable, "-c", CHILD]
    argv += ["/tmp", str(scratch / "venv"), str(scratch / "secret")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # the kept directory is there, as it was; the rest of the host's /tmp is not
    assert done.stdout.split()[:2] == ["interpreter", "False"], done.stdout
    assert done.stdout.split(None, 2)[2].strip() == f"['{scratch.name}']", done.stdout
    assert (scratch / "secret").exists()  # the host's own /tmp is untouched
