#!/usr/bin/env bash
# Worker-node role: one pool per stage, sized by INIT_WORKERS / RUN_WORKERS / EVAL_WORKERS.
set -euo pipefail
export PRORL_NODE="${PRORL_NODE:-$(hostname -s)}"
pids=()
for spec in "init:${INIT_WORKERS:-16}" "run:${RUN_WORKERS:-64}" "eval:${EVAL_WORKERS:-8}"; do
  queue=${spec%%:*} size=${spec##*:}
  celery -A prorl_celery worker -Q "$queue" -c "$size" -n "${queue}@${PRORL_NODE}" \
    --without-gossip --without-mingle -l info & pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' TERM INT
wait
