#!/usr/bin/env bash
# The user's install, checked end to end (issue 23, item 8). The tests install the `test` extra,
# which carries pytest and more; a user runs README command 1, `pip install -e '.[serve,model]'`.
# This builds a virtualenv with exactly that line (nothing from the system site-packages), starts
# the service as the README does (`prorl up`, the scripted LLM server registered with
# /add_llm_server), runs one job per domain through the gateway and checks each reward (driver:
# scripts/lib/user_install_check.py). Phase 2 uninstalls pytest from the venv, restarts the
# service and checks that the swe job is then refused (eval_error/env_error naming pytest), never
# scored 0.
#
#   PRORL_USER_VENV_CACHE  where the venv is kept between runs (default
#                          ~/.cache/prorl-celery/user-install): one venv per hash of setup.cfg,
#                          pyproject.toml, the two requirements files and the python; other
#                          hashes' venvs are removed
#   PRORL_USER_CHECK_DIR   logs and sandboxes of this run (default: a new /tmp/prorl-uic.*,
#                          removed when the check passes, kept and printed when it fails)
#   PRORL_USER_PYTHON      the python that makes the venv (default python3)
#
# Every process it starts carries PRORL_USER_CHECK_RUN=<id> in its environment; the driver and the
# trap below stop exactly those (and their sandboxes) whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
log() { echo "[user_install_check] $*" >&2; }

base_python="${PRORL_USER_PYTHON:-python3}"
cache="${PRORL_USER_VENV_CACHE:-${HOME:-/root}/.cache/prorl-celery/user-install}"
# setup.cfg reads install_requires from these two files: a change to either is a new install
key="$( (cat setup.cfg pyproject.toml requirements/service.txt singularity/sandbox-requirements.txt
         "$base_python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
venv="$cache/venv-$key"
stamp="$venv/.prorl-user-install-freeze"
# the README's user install, command 1 (without its apt-get and `prorl demo`)
install=(-m pip install -q -e '.[serve,model]')

# pip's warnings about this machine's extra local indexes (one per package) are noise here
pip_install() { "$venv/bin/python" "${install[@]}" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
freeze() { "$venv/bin/python" -m pip freeze --exclude-editable --all 2>/dev/null | LC_ALL=C sort; }

build_venv() {
  rm -rf "$venv"
  log "new venv $venv: $base_python -m venv, then pip install -e '.[serve,model]' (a few minutes)"
  "$base_python" -m venv "$venv"
  pip_install
  freeze >"$stamp"
}

mkdir -p "$cache"
for old in "$cache"/venv-*; do  # venvs of an earlier setup.cfg: about 1.5 GB each
  [[ -d "$old" && "$old" != "$venv" ]] && { log "removing $old (another setup.cfg)"; rm -rf "$old"; }
done
started=$SECONDS
if [[ -x "$venv/bin/python" && -f "$stamp" ]]; then
  # the same line again, for this checkout (the editable install points at it); it must leave the
  # venv exactly as a fresh install did (phase 2 of the last run removed pytest, say)
  pip_install
  if ! diff <(freeze) "$stamp" >/dev/null; then
    log "the cached venv differs from a fresh install:"
    diff <(freeze) "$stamp" >&2 || true
    build_venv
  else
    log "cached venv $venv, reinstalled for $repo"
  fi
else
  build_venv
fi
log "install: $(wc -l <"$stamp") packages, $(du -sh "$venv" | cut -f1), $((SECONDS - started)) s"

own_work=0
if [[ -z "${PRORL_USER_CHECK_DIR:-}" ]]; then
  PRORL_USER_CHECK_DIR="$(mktemp -d /tmp/prorl-uic.XXXXXX)"  # short: sandbox socket paths live under it
  own_work=1
fi
work="$PRORL_USER_CHECK_DIR"
mkdir -p "$work"
run_id="uic-$$-$(date +%s)"
driver="$repo/scripts/lib/user_install_check.py"
driver_pid=""

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -n "$driver_pid" ]] && kill -0 "$driver_pid" 2>/dev/null; then
    kill -TERM "$driver_pid" 2>/dev/null || true
    wait "$driver_pid" 2>/dev/null || true
  fi
  # whatever the driver could not stop (it was killed, say): every process marked with this run's
  # id, their descendants and the sandboxes under this run's directory
  "$base_python" "$repo/scripts/lib/user_install_procs.py" "$run_id" "$work/sb" || ((status)) || status=1
  if ((status == 0 && own_work)); then
    rm -rf "$work"
  else
    log "logs: $work"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# the venv as an activated one: its bin first on PATH, nothing else on the python path
env -u PYTHONPATH -u PYTHONHOME -u PYTHONSTARTUP -u PYTHONUSERBASE -u VIRTUAL_ENV \
  PATH="$venv/bin:$PATH" PYTHONNOUSERSITE=1 PRORL_USER_CHECK_RUN="$run_id" \
  "$venv/bin/python" "$driver" --venv "$venv" --workdir "$work" --run-id "$run_id" &
driver_pid=$!
wait "$driver_pid"
