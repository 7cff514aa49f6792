#!/usr/bin/env bash
# Worker-node role: one pool per stage, sized by INIT_WORKERS / RUN_WORKERS / EVAL_WORKERS.
# The node's name is Slurm's (SLURMD_NODENAME): a RUN worker consumes run.<node>, and
# /status and `prorl nodes` list the node under it.
#
# On SIGTERM (the allocation ends) the workers stop (stages still running after
# PRORL_SHUTDOWN_GRACE_S are handed back), then the sandboxes they leave are stopped: those of
# jobs that waited for RUN. Slurm cannot end those: bwrap takes its signals through a signalfd
# (SIGTERM does not end it), and once its worker exited it is no longer in the job step (the
# SIGKILL after KillWait misses it). head.sh keeps Redis up until every node's are gone.
set -euo pipefail
export PRORL_NODE="${PRORL_NODE:-${SLURMD_NODENAME:-$(hostname -s)}}"
pids=()
for spec in "init:${INIT_WORKERS:-16}" "run:${RUN_WORKERS:-64}" "eval:${EVAL_WORKERS:-8}"; do
  queue=${spec%%:*} size=${spec##*:}
  celery -A prorl_celery worker -Q "$queue" -c "$size" -n "${queue}@${PRORL_NODE}" \
    --without-gossip --without-mingle -l info & pids+=($!)
done
end() {
  trap '' TERM INT
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait || true
  prorl nodes close-sandboxes || true
  exit 0
}
trap end TERM INT
wait
