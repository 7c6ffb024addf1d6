"""What the node agent's start path imports: nothing it does not use (each heavy library
is ~0.1-0.2 s of a restart, which the service proxy's resync after a restart waits for)."""

from __future__ import annotations

import subprocess
import sys

from podnet.agent.heartbeat import NODE_LEASE_NAMESPACE
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE as SCHEMA_NAMESPACE


def test_the_agent_start_path_imports_no_pydantic() -> None:
    code = (
        "import sys, podnet.cli.main, podnet.agent.agent, podnet.dataplane.linux; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"


def test_the_heartbeat_renews_in_the_schemas_lease_namespace() -> None:
    assert NODE_LEASE_NAMESPACE == SCHEMA_NAMESPACE
