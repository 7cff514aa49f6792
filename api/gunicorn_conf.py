"""gunicorn settings for the gateway.

gevent workers by default: a client waiting in ``/process`` or ``GET /jobs/<id>?wait=`` is a
greenlet parked on an event (``prorl_celery.waiting``), not an OS thread, so one worker holds
thousands of waiting requests (``PRORL_GATEWAY_CONNECTIONS`` each). gunicorn's gevent worker
monkey-patches the process before the app loads, so redis-py, kombu and the waiter's listener
are cooperative. ``PRORL_GATEWAY_WORKER_CLASS=gthread`` is the thread-per-request fallback (each
waiting request holds one of ``PRORL_GATEWAY_THREADS``); never the sync worker, which cannot
hold long waits. Without gevent installed, gthread is used.
"""
import importlib.util

from prorl_celery.settings import Settings

_settings = Settings()  # the master's own read; the app factory reads again in each worker
bind = _settings.gateway_bind
worker_class = _settings.gateway_worker_class or ("gevent" if importlib.util.find_spec("gevent") else "gthread")
workers = _settings.gateway_workers
threads = _settings.gateway_threads  # gthread only
worker_connections = _settings.gateway_connections  # gevent: open requests per worker
backlog = 4096  # a burst of connections waits in the listen queue rather than being refused
timeout = 120  # both worker classes heartbeat from their own loop, so long waits do not trip this
graceful_timeout = 30
keepalive = 75
