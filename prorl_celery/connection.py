"""Redis clients, one pool per URL per process."""
from __future__ import annotations

import threading

import redis

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()

#: longest single blocking call we make (XREAD BLOCK); socket_timeout must exceed it
BLOCK_CHUNK_S = 5.0


def get_redis(url: str) -> redis.Redis:
    """A shared, thread-safe client for ``url`` (decoded strings, generous pool)."""
    with _lock:
        client = _clients.get(url)
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
            )
            client = _clients[url] = redis.Redis(connection_pool=pool)
        return client


def reset_clients() -> None:
    """Forget pooled clients (after fork, pools must not be shared with the parent)."""
    with _lock:
        for client in _clients.values():
            client.connection_pool.disconnect()
        _clients.clear()
