#!/usr/bin/env bash
# The whole test suite: set-up, then ruff, mypy and pytest (parallel with xdist).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check src tests bench
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
# Modules in collection order, not xdist's default (most tests first): tests/conftest.py
# puts the longest modules first, so no long one starts last and runs on alone.
.venv/bin/pytest -n "${PODNET_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder -q -p no:cacheprovider --durations=15 "$@"
if [ "$#" -eq 0 ]; then
  # The same e2e suites once more on the Open vSwitch data plane (issue 11): the full mesh
  # (vxlan and host-gw) with an agent SIGKILL under traffic, every NetworkPolicy case and
  # multitenant join/isolate/global, the pod attacks (tunnel injection, IP and MAC
  # spoofing), and podman through the CNI plugin.
  echo "== pytest: e2e again with PODNET_TEST_DATAPLANE=ovs"
  PODNET_TEST_DATAPLANE=ovs .venv/bin/pytest -n 3 --dist loadfile --no-loadscope-reorder -q -p no:cacheprovider \
    tests/e2e/test_cluster_e2e.py tests/e2e/test_policy_e2e.py tests/e2e/test_attacks_pods.py \
    tests/e2e/test_runtime.py
fi
