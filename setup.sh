#!/usr/bin/env bash
# One-time (and idempotent) set-up: a virtual environment in .venv with torch,
# the project and its gpu and dev extras, and Graphviz's `dot` for pictures.
# Re-running it is cheap: it reinstalls only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.planner-setup
want=$(sha256sum pyproject.toml setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing torch and the project (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v WARNING || true
  # the pinned torch is a CPU build on CPU-only machines here; GPU machines bring their own
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v WARNING || true
  .venv/bin/python -m pip install -q -e ".[gpu,dev]" 2>&1 | grep -v WARNING || true
  .venv/bin/python -c "import torch, pydantic, yaml, networkx, cutlass, planner" \
    || { echo "setup: install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
if ! command -v dot >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing graphviz (for planner viz)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null) \
      || echo "setup: graphviz not installed; planner viz will write DOT text instead of pictures" >&2
  else
    echo "setup: no 'dot' binary; install graphviz for pictures (planner viz writes DOT text without it)" >&2
  fi
fi
