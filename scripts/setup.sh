#!/usr/bin/env bash
# Create (or update) the course's virtual environment in .venv from requirements.txt.
# Idempotent and quick when nothing changed: a stamp records the installed requirement files.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.course-installed
want="$(cat requirements.txt pyproject.toml | cksum)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing pinned packages (first time: a few minutes)"
    pip_install() {  # hide pip's notices about index folders this machine does not have
        .venv/bin/python -m pip install --quiet "$@" 2> >(grep -v "is ignored: it is neither" >&2)
    }
    pip_install -r requirements.txt
    pip_install --no-deps -e .
    echo "$want" > "$stamp"
fi
