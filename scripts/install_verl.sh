#!/usr/bin/env bash
# Install verl into a virtual environment of its own, for the verl agent loop's test
# (tests/integration/test_vllm_real.py runs tests/support/verl_probe.py in it). Cached between runs
# (scripts/lib/cached_venv.sh).
#
# verl 0.9.1 pins transformers<5.11 and pulls ray, hydra, tensordict...: installing it into the
# project's python would downgrade transformers for everything else. The venv is isolated from the
# system python, as the vLLM venv is: one made with --system-site-packages imported whatever the
# system python gained later (transformers 5.25 there brings kernels 0.19, which verl's
# transformers 5.10 cannot import), so a venv that worked once broke on its next rebuild. It holds
# verl, the CPU torch 2.13.0 on disk (a constraint, never upgraded) and the trainer SDK's own
# needs (httpx, click), and this checkout of the project as an editable install without its
# dependencies (re-linked when the venv was built from another checkout), so that a verl trainer
# in the venv imports prorl_celery.trainer.integrations.verl as it is. The checks run with -I:
# the current directory must not stand in for the install.
#
#   PRORL_VERL_VERSION  verl version (default 0.9.1)
#   PRORL_VERL_VENV     where the venv lives (default /opt/verl-venv when writable, else
#                       ~/.cache/prorl-celery/verl-venv)
#
# Prints the venv's python on the last line of stdout (what PRORL_VERL_PYTHON should be).
set -euo pipefail
source "$(dirname "$0")/lib/cached_venv.sh"
root="$(cd "$(dirname "$0")/.." && pwd)"
name=verl
version="${PRORL_VERL_VERSION:-0.9.1}"
want="verl==$version"
venv_override="${PRORL_VERL_VENV:-}"

links_this_checkout() {
  "$venv/bin/python" -I - "$root" <<'PY' >/dev/null 2>&1
import os, sys
import prorl_celery
assert os.path.realpath(prorl_celery.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep)
PY
}

repair_venv() {
  links_this_checkout && return 0
  log "linking $root into $venv (pip install --no-deps -e)"
  "$venv/bin/python" -m pip install -q --no-deps -e "$root" >&2 || true
}

imports_ok() {
  # a venv that sees the system site-packages (as this script once made it) is rebuilt
  grep -qx 'include-system-site-packages = false' "$venv/pyvenv.cfg" || return 1
  links_this_checkout || return 1
  "$venv/bin/python" -I - "$version" <<'PY' >/dev/null 2>&1
import sys
import verl
from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput  # noqa: F401
assert verl.__version__ == sys.argv[1], verl.__version__
import prorl_celery.trainer.integrations.verl  # noqa: F401  (the adapter the probe loads)
import torch
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
PY
}

install_into_venv() {
  "$(command -v python || command -v python3)" -m venv "$venv"
  local constraints
  constraints="$(mktemp)"
  echo "torch==2.13.0" >"$constraints"
  # cachetools, fastapi, uvicorn: imported by verl.workers.rollout (which the agent loop
  # imports) but not declared by verl 0.9.1; httpx, click: the trainer SDK's imports
  "$venv/bin/python" -m pip install -q -c "$constraints" torch==2.13.0 "$want" cachetools fastapi uvicorn httpx click
  rm -f "$constraints"
}

cached_venv_main
