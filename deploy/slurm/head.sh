#!/usr/bin/env bash
# Head-node role: Redis, the gateway (gunicorn gthread) and Flower; stops all three on SIGTERM.
set -euo pipefail
pids=()
redis-server --port "${REDIS_PORT:-6379}" --bind 0.0.0.0 --save "" --appendonly no --maxclients 20000 \
  ${PRORL_REDIS_PASSWORD:+--requirepass "$PRORL_REDIS_PASSWORD"} & pids+=($!)
sleep 1
gunicorn -c python:api.gunicorn_conf 'api:create_app()' & pids+=($!)
celery -A prorl_celery flower --port="${FLOWER_PORT:-5555}" & pids+=($!)
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' TERM INT
wait
