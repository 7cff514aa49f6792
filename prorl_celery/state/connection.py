"""Redis clients, one pool per URL per process, each riding out a Redis outage.

A command that meets a connection error (Redis restarting, still loading its AOF, a failover)
is sent again with exponential backoff and jitter (redis-py's ``Retry``), for about
``retry_s`` seconds in all, before the error reaches the caller: the workers' stages get
``PRORL_REDIS_RETRY_S`` (a restart costs them no attempt), the gateway
``PRORL_GATEWAY_REDIS_RETRY_S`` (short: past it a client gets a 503 it retries itself).

A ``sentinel://`` URL (docs/running.md, "Redis Sentinel") names the sentinels instead of a
server, in kombu's form so that one URL serves the broker and the state alike:
``sentinel://[:password@]host:port[/db];sentinel://host:port;...``. Its clients ask the
sentinels for the primary of ``master_name`` on every new connection, so after a failover the
retry above lands on the new primary.
"""
from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from prorl_celery.state._redis_raw import FailoverAwareConnection

_clients: dict[tuple[str, float, str, str | None], redis.Redis] = {}
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


#: the sentinels' port when a sentinel:// URL names none (redis-sentinel's default)
SENTINEL_PORT = 26379
#: the master name a sentinel:// URL is resolved with when the caller names none
DEFAULT_SENTINEL_MASTER = "prorl"


@dataclass(frozen=True)
class SentinelURL:
    """What a ``sentinel://`` URL says: where the sentinels listen, the database, and the
    primary's credentials (the sentinels' own password is a setting: kombu's form has no room)."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel(url: str) -> bool:
    return urlsplit(url.split(";", 1)[0].strip()).scheme == "sentinel"


def parse_sentinel_url(url: str) -> SentinelURL:
    """``sentinel://[[user]:password@]host[:port][/db];sentinel://host[:port];...``: the database
    and credentials are read from the first part that has them (kombu reads the first's)."""
    sentinels: list[tuple[str, int]] = []
    db: int | None = None
    username = password = None
    for part in filter(None, (piece.strip() for piece in url.split(";"))):
        parts = urlsplit(part)
        if parts.scheme != "sentinel" or not parts.hostname:
            raise ValueError(f"{part!r} in a sentinel URL: every part must be sentinel://host:port")
        sentinels.append((parts.hostname, parts.port or SENTINEL_PORT))
        path = parts.path.strip("/")
        if path and db is None:
            if not path.isdigit():
                raise ValueError(f"{part!r}: the path of a sentinel URL is the database number")
            db = int(path)
        if parts.password is not None and password is None:
            username, password = unquote(parts.username or "") or None, unquote(parts.password)
    if not sentinels:
        raise ValueError("a sentinel URL names no sentinel")
    return SentinelURL(tuple(sentinels), db or 0, username, password)


def open_redis(url: str, *, retry_s: float = 0.0, master_name: str = DEFAULT_SENTINEL_MASTER,
               sentinel_password: str | None = None, **options: Any) -> redis.Redis:
    """A new client for ``url`` (``redis://``, ``rediss://``, ``unix://`` or ``sentinel://``),
    decoded strings, its commands retrying a connection error for about ``retry_s`` seconds;
    ``options`` override the connection keywords (timeouts). Callers that live long share
    ``get_redis``'s instead."""
    connection: dict[str, Any] = {
        "decode_responses": True, "socket_timeout": BLOCK_CHUNK_S + 25, "socket_connect_timeout": 10,
        "health_check_interval": 30, "retry_on_timeout": False, "retry": outage_retry(retry_s), **options}
    if not is_sentinel(url):
        pool = redis.BlockingConnectionPool.from_url(url, max_connections=1024, timeout=30, **connection)
        return redis.Redis(connection_pool=pool)
    where = parse_sentinel_url(url)
    sentinel_options = {key: connection[key] for key in ("socket_timeout", "socket_connect_timeout")}
    if sentinel_password is not None:
        sentinel_options["password"] = sentinel_password
    credentials = {"username": where.username, "password": where.password}
    sentinel = Sentinel(list(where.sentinels), sentinel_kwargs=sentinel_options, db=where.db,
                        **{key: value for key, value in credentials.items() if value is not None}, **connection)
    # redis-py's sentinel pool cannot block for a free connection: a generous cap instead
    return sentinel.master_for(master_name, max_connections=1024, connection_class=FailoverAwareConnection)


def get_redis(url: str, retry_s: float = 0.0, *, master_name: str = DEFAULT_SENTINEL_MASTER,
              sentinel_password: str | None = None) -> redis.Redis:
    """A shared, thread-safe client for ``url`` (``open_redis``'s, one per process per URL and
    retry) whose commands retry a connection error for about ``retry_s`` seconds."""
    key = (url, retry_s, master_name, sentinel_password)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = open_redis(url, retry_s=retry_s, master_name=master_name,
                                                sentinel_password=sentinel_password)
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
