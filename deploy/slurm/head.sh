#!/usr/bin/env bash
# Head-node role: Redis, the gateway (gunicorn) and Flower; on SIGTERM, the service's end.
#
# Redis appends every write to a file fsynced every second (AOF), in PRORL_REDIS_DIR (default
# ${XDG_STATE_HOME:-~/.local/state}/prorl/slurm-redis): a restart of Redis, or of this job on
# the same directory, loses at most about a second of writes instead of every accepted job.
# PRORL_REDIS_PERSISTENCE=none keeps nothing on disk. See deploy/README.md, "Persistence".
#
# Redis requires PRORL_REDIS_PASSWORD (prorl.sbatch makes one up when it is not set): it
# listens on every interface, where Redis's protected mode would refuse the other nodes
# anyway. The password reaches redis-server on its standard input, not its command line.
#
# The end. Slurm signals every process of the allocation at once (SIGTERM, then SIGKILL after
# KillWait), so Redis is started with SIGTERM and SIGINT blocked: it outlives the workers, whose
# last writes (stages handed back, cancels) must land, and is shut down here after them. What
# happens to the jobs not yet ended depends on why the allocation ends, which Slurm's job record
# tells (`scontrol show job`; its state alone says COMPLETING for both scancel and the limit):
#   still RUNNING: the hand-back prorl.sbatch starts at its time-limit warning (or an operator's
#     `scancel --batch --signal=USR1`); and its run time at its time limit: the limit itself.
#     The jobs stay in Redis's file, handed back by the workers, and the next allocation on the
#     same PRORL_REDIS_DIR finishes them;
#   anything else (scancel): they end as cancelled, and the trainers waiting on them are answered.
#
# With PRORL_REDIS_REPLICATION=sentinel, Redis is a Sentinel group of its own job step
# (redis.sh, on the first three nodes): this script starts no redis-server, and stops the
# group (`prorl sentinel stop`) where it would have shut its own down.
set -euo pipefail
: "${PRORL_SHUTDOWN_GRACE_S:=20}" "${PRORL_REDIS_REPLICATION:=none}"
[[ -n "${PRORL_REDIS_PASSWORD:-}" ]] || { echo "PRORL_REDIS_PASSWORD is not set" >&2; exit 1; }
export REDISCLI_AUTH="$PRORL_REDIS_PASSWORD"
persistence=(--save "" --appendonly no)
if [[ "$PRORL_REDIS_REPLICATION" == sentinel ]]; then
  :
elif [[ "${PRORL_REDIS_PERSISTENCE:-aof}" == aof ]]; then
  dir="${PRORL_REDIS_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/prorl/slurm-redis}"
  mkdir -p "$dir"
  # two redis-servers appending to one file corrupt it: one head per directory
  exec 9>"$dir/prorl-head.lock"
  flock -n 9 || { echo "another head keeps its Redis data in $dir: set PRORL_REDIS_DIR" >&2; exit 1; }
  persistence=(--dir "$dir" --appendonly yes --appendfsync everysec --save "")
elif [[ "${PRORL_REDIS_PERSISTENCE}" != none ]]; then
  echo "PRORL_REDIS_PERSISTENCE must be aof or none, not '${PRORL_REDIS_PERSISTENCE}'" >&2; exit 1
fi
deaf=(python -c 'import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
os.execvp(sys.argv[1], sys.argv[1:])')
redis=
if [[ "$PRORL_REDIS_REPLICATION" != sentinel ]]; then
  # the password quoted as Redis's configuration reads it (it may hold spaces or quotes)
  secret=$(python -c 'import sys; print("\"" + sys.argv[1].replace("\\", "\\\\").replace("\"", "\\\"") + "\"")' "$PRORL_REDIS_PASSWORD")
  "${deaf[@]}" redis-server - --port "${REDIS_PORT:-6379}" --bind 0.0.0.0 "${persistence[@]}" \
    --maxclients 20000 <<<"requirepass $secret" & redis=$!  # holds the lock too
  for _ in $(seq 100); do redis-cli -p "${REDIS_PORT:-6379}" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
pids=()
gunicorn -c python:api.gunicorn_conf 'api:create_app()' 9>&- & pids+=($!)
celery -A prorl_celery flower --port="${FLOWER_PORT:-5555}" 9>&- & pids+=($!)

why_ending() {  # hand-back, timeout or cancelled, from the job's record
  scontrol show job "${SLURM_JOB_ID:-0}" -o 2>/dev/null | python -c '
import re, sys
job = dict(re.findall(r"(\w+)=(\S+)", sys.stdin.read()))
def seconds(t):
    days, _, t = t.rpartition("-")
    h, m, s = ([0, 0] + [int(p) for p in t.split(":")])[-3:]
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s
limit = job.get("TimeLimit", "UNLIMITED")
if job.get("JobState") == "RUNNING":
    print("hand-back")
elif limit[:1].isdigit() and seconds(job.get("RunTime", "0")) >= seconds(limit):
    print("timeout")
else:
    print("cancelled")' || echo cancelled
}

end() {
  trap '' TERM INT
  kill -TERM "${pids[@]}" 2>/dev/null || true
  why=$(why_ending)
  cancel=()
  [[ "$why" == cancelled ]] && cancel=(--cancel-jobs)
  echo "head: the allocation ends ($why): ${cancel:+cancelling the jobs, }waiting for the workers"
  prorl shutdown "${cancel[@]}" --wait "$((PRORL_SHUTDOWN_GRACE_S + 15))" 9>&- || true
  # gunicorn's graceful stop waits out idle keep-alive connections: the jobs are answered by now
  kill -QUIT "${pids[@]}" 2>/dev/null || true
  if [[ -n "$redis" ]]; then
    redis-cli -p "${REDIS_PORT:-6379}" shutdown >/dev/null 2>&1 || kill -KILL "$redis" 2>/dev/null || true
  else
    prorl sentinel stop --group-id "${SLURM_JOB_ID:-default}" 9>&- || true
  fi
  wait || true
  exit 0
}
trap end TERM INT
wait
