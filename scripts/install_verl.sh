#!/usr/bin/env bash
# Install verl into a virtual environment of its own, for the verl agent loop's test
# (tests/integration/test_vllm_real.py runs tests/support/verl_probe.py in it). Cached between runs
# (scripts/lib/cached_venv.sh).
#
# verl 0.9.1 pins transformers<5.11 and pulls ray, hydra, tensordict...: installing it into the
# project's python would downgrade transformers for everything else. The venv sees the system
# site-packages (torch, the project itself, httpx) and shadows only what verl pins; torch stays
# the CPU 2.13.0 on disk (a constraint, never upgraded).
#
#   PRORL_VERL_VERSION  verl version (default 0.9.1)
#   PRORL_VERL_VENV     where the venv lives (default /opt/verl-venv when writable, else
#                       ~/.cache/prorl-celery/verl-venv)
#
# Prints the venv's python on the last line of stdout (what PRORL_VERL_PYTHON should be).
set -euo pipefail
source "$(dirname "$0")/lib/cached_venv.sh"
name=verl
version="${PRORL_VERL_VERSION:-0.9.1}"
want="verl==$version"
venv_override="${PRORL_VERL_VENV:-}"

imports_ok() {
  "$venv/bin/python" - "$version" <<'PY' >/dev/null 2>&1
import sys
import verl
from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput  # noqa: F401
assert verl.__version__ == sys.argv[1], verl.__version__
import torch
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
PY
}

install_into_venv() {
  "$(command -v python || command -v python3)" -m venv --system-site-packages "$venv"
  local constraints
  constraints="$(mktemp)"
  echo "torch==2.13.0" >"$constraints"
  # cachetools, fastapi, uvicorn: imported by verl.workers.rollout (which the agent loop
  # imports) but not declared by verl 0.9.1; on a machine whose system python already had them
  # the venv saw those, on a fresh one the import failed
  "$venv/bin/python" -m pip install -q -c "$constraints" "$want" cachetools fastapi uvicorn
  rm -f "$constraints"
}

cached_venv_main
