#!/usr/bin/env bash
# Create (or update) the course's virtual environment in .venv from requirements.txt.
# Idempotent and quick when nothing changed: a stamp records the installed requirement files and
# the package index they came from. Each step prints one line with the time it took.
#
# torch: on Linux with no NVIDIA driver, PyPI's default torch wheel carries CUDA (several GB) that
# the machine cannot use; if PyTorch's CPU index answers, it is used instead (COURSE_TORCH_INDEX
# overrides: a URL, or "pypi" for PyPI's own wheel). A different index re-installs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
T0=$(date +%s)
say() { echo "setup: $* ($(( $(date +%s) - T0 )) s)"; }

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    say "created .venv with $($PYTHON --version)"
fi

cpu_index=https://download.pytorch.org/whl/cpu
index="${COURSE_TORCH_INDEX:-}"
if [ -z "$index" ] && [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 \
        && [ ! -e /proc/driver/nvidia ] && [ -z "${PIP_EXTRA_INDEX_URL:-}${PIP_INDEX_URL:-}" ]; then
    if .venv/bin/python - "$cpu_index" <<'EOF' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=5)
EOF
        index="$cpu_index"
    fi
fi
[ "$index" = pypi ] && index=""

stamp=.venv/.course-installed
want="$(cat requirements.txt pyproject.toml | cksum) index=${index} extra=${PIP_EXTRA_INDEX_URL:-}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing the pinned packages${index:+ (torch from $index)}: a few minutes the first time"
    extra=()
    [ -n "$index" ] && extra=(--extra-index-url "$index")
    # one line per package pip starts on, with the time so far (pip itself is silent for minutes)
    if ! .venv/bin/python -m pip install --progress-bar off ${extra[@]+"${extra[@]}"} \
            -r requirements.txt 2>&1 | while IFS= read -r line; do
                case "$line" in
                    Collecting\ *) say "  ${line%% (*}" ;;
                    "Installing collected packages"*)
                        say "  unpacking and installing them all (the longest step, 1-3 minutes, silent)" ;;
                    "Successfully installed"*) say "  installed $(( $(echo "$line" | wc -w) - 2 )) packages" ;;
                    ERROR*|error*|*"No matching distribution"*) echo "$line" >&2 ;;
                esac
            done; then
        echo "setup: pip failed (the lines above say why)" >&2
        exit 1
    fi
    .venv/bin/python -m pip install --quiet --no-deps -e . 2> >(grep -v "is ignored: it is neither" >&2)
    echo "$want" > "$stamp"
    say "done"
fi

# The class hub's proxy (scripts/hub.py, make hub): JupyterHub's configurable-http-proxy, a Node
# program, into .venv/node. Skipped where npm is missing (the hub then says how to get it).
chp=.venv/node/node_modules/.bin/configurable-http-proxy
if [ ! -x "$chp" ] && command -v npm >/dev/null 2>&1; then
    if npm install --silent --no-audit --no-fund --prefix .venv/node configurable-http-proxy@5.3.0 \
            >/dev/null 2>&1; then
        say "installed configurable-http-proxy 5.3.0 (the class hub's proxy) into .venv/node"
    else
        echo "setup: npm could not install configurable-http-proxy (only make hub needs it)" >&2
    fi
fi

# jsonschema imports rfc3987-syntax (pulled in by jupyter-events' jsonschema[format-nongpl]) as it
# is imported, and that builds 38 Lark parsers: 1.6 s of CPU in every process that imports
# nbformat (nbgrader, nbclient, JupyterLab, every test worker; benchmarks/import_cost.py). It
# only validates the "iri" formats, which no schema of jupyter-events, jupyter_server, nbformat
# or nbgrader uses; without it jsonschema skips those formats (tests/test_setup.py checks both).
if compgen -G ".venv/lib/python3*/site-packages/rfc3987_syntax" >/dev/null; then
    .venv/bin/python -m pip uninstall --quiet --yes rfc3987-syntax
    say "removed rfc3987-syntax (1.6 s of CPU per process that imports nbformat)"
fi
