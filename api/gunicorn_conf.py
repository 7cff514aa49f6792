"""gunicorn settings for the gateway: threads, because /process holds a request per job."""
import os

bind = os.environ.get("PRORL_GATEWAY_BIND", "127.0.0.1:8080")
worker_class = "gthread"  # the sync worker cannot hold hundreds of waiting requests
workers = int(os.environ.get("PRORL_GATEWAY_WORKERS", "2"))
threads = int(os.environ.get("PRORL_GATEWAY_THREADS", "128"))
timeout = 120  # gthread workers heartbeat from their main loop, so long waits do not trip this
graceful_timeout = 30
keepalive = 75
