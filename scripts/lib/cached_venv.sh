# Shared by scripts/install_vllm.sh and scripts/install_verl.sh: a virtual environment kept
# between runs on the same machine, reused when its stamp names the wanted package AND the
# caller's `imports_ok` passes in it, otherwise removed and rebuilt. A venv that imports the
# right version but has no stamp (built by hand) is adopted.
#
# The caller sets `name` (vllm, verl), `want` (pip requirement) and `venv_override` (its
# PRORL_*_VENV), and defines:
#   imports_ok         true when "$venv/bin/python" has what the tests need
#   install_into_venv  installs "$want" into the freshly made "$venv"
#   repair_venv        (optional) runs before every check, e.g. to drop packages that break imports
# then calls `cached_venv_main`, which prints the venv's python on the last line of stdout.

log() { echo "[install_$name] $*" >&2; }

repair_venv() { :; }

cached_venv_main() {
  if [[ -n "${venv_override:-}" ]]; then
    venv="$venv_override"
  elif [[ -w /opt || -w "/opt/$name-venv" ]]; then
    venv="/opt/$name-venv"
  else
    venv="$HOME/.cache/prorl-celery/$name-venv"
  fi
  local stamp="$venv/.prorl-$name-stamp"
  if [[ -x "$venv/bin/python" ]]; then
    if [[ ! -f "$stamp" || "$(cat "$stamp")" == "$want" ]]; then
      repair_venv
      if imports_ok; then
        [[ -f "$stamp" ]] || log "adopting the existing $venv (no stamp yet)"
        echo "$want" >"$stamp"
        log "$want ready in $venv (cached)"
        echo "$venv/bin/python"
        return 0
      fi
    fi
    log "$venv is stale or broken (stamp: $(cat "$stamp" 2>/dev/null || echo none)); rebuilding"
    rm -rf "$venv"
  fi
  log "installing $want into $venv (a few minutes)"
  mkdir -p "$(dirname "$venv")"
  install_into_venv
  repair_venv
  if ! imports_ok; then
    log "$name does not import in $venv after installing $want:"
    "$venv/bin/python" -c "import $name" >&2 || true
    return 1
  fi
  echo "$want" >"$stamp"
  log "$want ready in $venv"
  echo "$venv/bin/python"
}
