#!/usr/bin/env bash
# Head-node role: Redis, the gateway (gunicorn gthread) and Flower; stops all three on SIGTERM.
#
# Redis appends every write to a file fsynced every second (AOF), in PRORL_REDIS_DIR (default
# ${XDG_STATE_HOME:-~/.local/state}/prorl/slurm-redis): a restart of Redis, or of this job on
# the same directory, loses at most about a second of writes instead of every accepted job.
# PRORL_REDIS_PERSISTENCE=none keeps nothing on disk. See deploy/README.md, "Persistence".
set -euo pipefail
persistence=(--save "" --appendonly no)
if [[ "${PRORL_REDIS_PERSISTENCE:-aof}" == aof ]]; then
  dir="${PRORL_REDIS_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/prorl/slurm-redis}"
  mkdir -p "$dir"
  # two redis-servers appending to one file corrupt it: one head per directory
  exec 9>"$dir/prorl-head.lock"
  flock -n 9 || { echo "another head keeps its Redis data in $dir: set PRORL_REDIS_DIR" >&2; exit 1; }
  persistence=(--dir "$dir" --appendonly yes --appendfsync everysec --save "")
elif [[ "${PRORL_REDIS_PERSISTENCE}" != none ]]; then
  echo "PRORL_REDIS_PERSISTENCE must be aof or none, not '${PRORL_REDIS_PERSISTENCE}'" >&2; exit 1
fi
pids=()
redis-server --port "${REDIS_PORT:-6379}" --bind 0.0.0.0 "${persistence[@]}" --maxclients 20000 \
  ${PRORL_REDIS_PASSWORD:+--requirepass "$PRORL_REDIS_PASSWORD"} & pids+=($!)  # holds the lock too
sleep 1
gunicorn -c python:api.gunicorn_conf 'api:create_app()' 9>&- & pids+=($!)
celery -A prorl_celery flower --port="${FLOWER_PORT:-5555}" 9>&- & pids+=($!)
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' TERM INT
wait
