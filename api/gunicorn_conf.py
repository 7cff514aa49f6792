"""gunicorn settings for the gateway.

gevent workers by default: a client waiting in ``/process`` or ``GET /jobs/<id>?wait=`` is a
greenlet parked on an event (``prorl_celery.state.waiting``), not an OS thread, so one worker holds
thousands of waiting requests (``PRORL_GATEWAY_CONNECTIONS`` each). gunicorn's gevent worker
monkey-patches the process before the app loads, so redis-py, kombu and the waiter's listener
are cooperative. ``PRORL_GATEWAY_WORKER_CLASS=gthread`` is the thread-per-request fallback (each
waiting request holds one of ``PRORL_GATEWAY_THREADS``); never the sync worker, which cannot
hold long waits. Without gevent installed, gthread is used. gunicorn parses requests with its C
parser when ``gunicorn-h1c`` (a dependency) is installed (its default ``http_parser = auto``).

These ``PRORL_GATEWAY_*`` variables are the one group read outside ``prorl_celery.core.settings``, and
on purpose: gunicorn's master imports this file before the gevent worker monkey-patches, and any
service module imported here (the settings included) would keep unpatched locks that freeze a
worker's greenlets (``tests/integration/test_waiting.py`` checks that nothing of the service loads).
"""
import importlib.util
import os

bind = os.environ.get("PRORL_GATEWAY_BIND", "127.0.0.1:8080")
worker_class = os.environ.get("PRORL_GATEWAY_WORKER_CLASS") or (
    "gevent" if importlib.util.find_spec("gevent") else "gthread")
workers = int(os.environ.get("PRORL_GATEWAY_WORKERS", "2"))
threads = int(os.environ.get("PRORL_GATEWAY_THREADS", "128"))  # gthread only
worker_connections = int(os.environ.get("PRORL_GATEWAY_CONNECTIONS", "10000"))  # gevent: open requests per worker
backlog = 4096  # a burst of connections waits in the listen queue rather than being refused
timeout = 120  # both worker classes heartbeat from their own loop, so long waits do not trip this
graceful_timeout = 30
keepalive = 75
