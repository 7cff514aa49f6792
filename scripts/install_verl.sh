#!/usr/bin/env bash
# Install verl into a virtual environment of its own, for the verl agent loop's test
# (tests/test_verl_agent_loop.py runs tests/support/verl_probe.py in it).
#
# verl 0.9.1 pins transformers<5.11 and pulls ray, hydra, tensordict...: installing it into the
# project's python would downgrade transformers for everything else. The venv sees the system
# site-packages (torch, the project itself, httpx) and shadows only what verl pins; torch stays
# the CPU 2.13.0 on disk (a constraint, never upgraded).
#
# Cached like scripts/install_vllm.sh: reused when its stamp names the wanted version AND
# `import verl.experimental.agent_loop` works in it; otherwise removed and rebuilt.
#
#   PRORL_VERL_VERSION  verl version (default 0.9.1)
#   PRORL_VERL_VENV     where the venv lives (default /opt/verl-venv when writable, else
#                       ~/.cache/prorl-celery/verl-venv)
#
# Prints the venv's python on the last line of stdout (what PRORL_VERL_PYTHON should be).
set -euo pipefail
version="${PRORL_VERL_VERSION:-0.9.1}"
if [[ -n "${PRORL_VERL_VENV:-}" ]]; then
  venv="$PRORL_VERL_VENV"
elif [[ -w /opt || -w /opt/verl-venv ]]; then
  venv=/opt/verl-venv
else
  venv="$HOME/.cache/prorl-celery/verl-venv"
fi
stamp="$venv/.prorl-verl-stamp"
want="verl==$version"
log() { echo "[install_verl] $*" >&2; }

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

if [[ -x "$venv/bin/python" ]]; then
  if [[ ! -f "$stamp" || "$(cat "$stamp")" == "$want" ]] && imports_ok; then
    [[ -f "$stamp" ]] || log "adopting the existing $venv (no stamp yet)"
    echo "$want" >"$stamp"
    log "$want ready in $venv (cached)"
    echo "$venv/bin/python"
    exit 0
  fi
  log "$venv is stale or broken (stamp: $(cat "$stamp" 2>/dev/null || echo none)); rebuilding"
  rm -rf "$venv"
fi

log "installing $want into $venv (a few minutes)"
mkdir -p "$(dirname "$venv")"
python="$(command -v python || command -v python3)"
"$python" -m venv --system-site-packages "$venv"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" >"$constraints"
# cachetools: imported by verl.workers.rollout.router (which the agent loop imports) but not
# declared by verl 0.9.1
"$venv/bin/python" -m pip install -q -c "$constraints" "$want" cachetools
if ! imports_ok; then
  log "verl does not import in $venv after installing $want:"
  "$venv/bin/python" -c "from verl.experimental.agent_loop import AgentLoopBase" >&2 || true
  exit 1
fi
echo "$want" >"$stamp"
log "$want ready in $venv"
echo "$venv/bin/python"
