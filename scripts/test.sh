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
.venv/bin/pytest -n "${PODNET_TEST_WORKERS:-4}" --dist loadfile -q -p no:cacheprovider "$@"
