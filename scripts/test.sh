#!/usr/bin/env bash
# Install gpusv with its test tools into .venv and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/pytest -n 2 -q "$@"
