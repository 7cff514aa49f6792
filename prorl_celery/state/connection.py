"""Redis clients, one pool per URL per process, each riding out a Redis outage.

A command that meets a connection error (Redis restarting, still loading its AOF, a failover)
is sent again with exponential backoff and jitter (redis-py's ``Retry``), for about
``retry_s`` seconds in all, before the error reaches the caller: the workers' stages get
``PRORL_REDIS_RETRY_S`` (a restart costs them no attempt), the gateway
``PRORL_GATEWAY_REDIS_RETRY_S`` (short: past it a client gets a 503 it retries itself).
"""
from __future__ import annotations

import ssl
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

_clients: dict[tuple[str, float], redis.Redis] = {}
_lock = threading.Lock()

#: longest single blocking call we make (XREAD BLOCK); socket_timeout must exceed it
BLOCK_CHUNK_S = 5.0

# redis-py's stubs type each reply for every kind of client (bytes or str, RESP2 or RESP3
# shapes). Ours are all decode_responses=True RESP2 clients (get_redis), so a caller casts a
# reply once, where it reads it, to the shape it really has:
#: one stream entry, as XRANGE/XREVRANGE list them: (id, fields)
StreamEntry = tuple[str, dict[str, str]]
#: ZRANGE/ZRANGEBYSCORE with withscores=True: (member, score)
ScoredMembers = list[tuple[str, float]]


#: the first retry's wait, and the longest wait between two tries
RETRY_BASE_S, RETRY_CAP_S = 0.05, 1.0


def retries_within(seconds: float, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S) -> int:
    """How many retries, waiting ``base_s * 2**i`` capped at ``cap_s`` between them, fill
    ``seconds`` (0: none)."""
    retries, waited = 0, 0.0
    while waited < seconds:
        waited += min(cap_s, base_s * 2 ** retries)
        retries += 1
    return retries


def outage_retry(seconds: float) -> Retry:
    """redis-py's retry of a command on a connection error, for about ``seconds`` in all."""
    return Retry(ExponentialWithJitterBackoff(base=RETRY_BASE_S, cap=RETRY_CAP_S), retries_within(seconds),
                 supported_errors=(redis.ConnectionError, redis.TimeoutError))


def get_redis(url: str, retry_s: float = 0.0) -> redis.Redis:
    """A shared, thread-safe client for ``url`` (decoded strings, generous pool) whose commands
    retry a connection error for about ``retry_s`` seconds."""
    with _lock:
        client = _clients.get((url, retry_s))
        if client is None:
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=1024,
                timeout=30,
                decode_responses=True,
                socket_timeout=BLOCK_CHUNK_S + 25,
                socket_connect_timeout=10,
                health_check_interval=30,
                retry_on_timeout=False,
                retry=outage_retry(retry_s),
            )
            client = _clients[(url, retry_s)] = redis.Redis(connection_pool=pool)
        return client


def reset_clients() -> None:
    """Forget pooled clients (after fork, pools must not be shared with the parent)."""
    with _lock:
        for client in _clients.values():
            client.connection_pool.disconnect()
        _clients.clear()


_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
_SSL_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def broker_ssl_options(url: str) -> dict[str, Any] | None:
    """Celery's ``broker_use_ssl`` for a ``rediss://`` URL, from the URL's own query.

    redis-py reads ``ssl_cert_reqs``/``ssl_ca_certs``/... from the query, but kombu's Redis
    transport ignores them and, with no ``broker_use_ssl``, falls back to CERT_NONE (no
    certificate check at all). This gives the broker what the URL says, verifying by default,
    so ``PRORL_REDIS_URL``/``PRORL_BROKER_URL`` alone configure TLS for every client.
    """
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return None
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    reqs = query.get("ssl_cert_reqs", "required").lower().removeprefix("cert_")
    if reqs not in _CERT_REQS:
        raise ValueError(f"ssl_cert_reqs={query['ssl_cert_reqs']!r} in the Redis URL: use required, optional or none")
    options: dict[str, Any] = {"ssl_cert_reqs": _CERT_REQS[reqs]}
    options.update({name: query[name] for name in _SSL_FILES if name in query})
    return options
