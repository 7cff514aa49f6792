#!/usr/bin/env bash
# A Redis Sentinel member (PRORL_REDIS_REPLICATION=sentinel), one on each of the allocation's
# first three nodes: node 0 the first primary and a sentinel, node 1 the replica and a sentinel,
# node 2 a sentinel (prorl_celery/dev/sentinel_member.py says how each host supervises its own).
#
# The servers keep an append-only file each under PRORL_REDIS_DIR (server-1, server-2), which
# must be a filesystem the nodes share: the next allocation's node 0 takes the last primary's.
# PRORL_REDIS_PERSISTENCE=none keeps nothing on disk. Servers and sentinels both require
# PRORL_REDIS_PASSWORD, read from the environment, never from a command line.
#
# The members ignore Slurm's SIGTERM, so that Redis outlives the workers' last writes; head.sh
# ends them (`prorl sentinel stop`) once the workers are gone, and KillWait's SIGKILL is the
# backstop.
set -euo pipefail
[[ -n "${PRORL_REDIS_PASSWORD:-}" ]] || { echo "PRORL_REDIS_PASSWORD is not set" >&2; exit 1; }
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
sentinels=()
for node in "${nodes[@]:0:3}"; do sentinels+=(--sentinel "${node}:${SENTINEL_PORT:-26379}"); done
exec prorl sentinel member --slot "$SLURM_NODEID" --primary-host "${nodes[0]}" "${sentinels[@]}" \
  --dir "${PRORL_REDIS_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/prorl/slurm-redis}" \
  --port "${REDIS_PORT:-6379}" --sentinel-port "${SENTINEL_PORT:-26379}" --group-id "$SLURM_JOB_ID" \
  --persistence "${PRORL_REDIS_PERSISTENCE:-aof}" --outlive-term
