"""kombu's internals, patched here and nowhere else (pinned: ``TESTED_WITH``).

What is patched, and why:

- ``_QoS`` (kombu.transport.redis.QoS): the ack emulation's two bookkeeping writes per delivery
  and per ack sent as one pipeline without MULTI/EXEC (they were twelve of a job's Redis
  commands, ``python -m bench.overhead``), and acks of queues consumed without acks made no-ops.
  It reads ``message._raw`` and ``QoS._delivered``.
- ``_Channel`` (kombu.transport.redis.Channel): one synchronous client per channel instead of
  one per call (``_create_client``): about 190 us of CPU saved per publish, delivery
  bookkeeping and ack, nine times per job. A channel that outlives its connection (the
  connection lost, its transport let go) restores its unacked messages through that client
  instead of building a pool from parameters that are gone: kombu's own path raised
  ``AttributeError('NoneType' object has no attribute 'hostname')`` there, which Celery's
  consumer takes as unrecoverable, and the RUN worker process died on a Redis restart.
- ``_SentinelChannel``: both patches on kombu's Sentinel channel too (``sentinel://`` brokers).
- ``fetch_gate``/``set_fetch_gate``: read and replace a channel QoS's ``can_consume``, the hook Celery's own
  ``worker_disable_prefetch`` wraps, so that a worker fetches only what it can start.

``tests/integration/test_library_internals.py`` fails, naming the version, on a kombu outside
``TESTED_WITH``, and checks that every attribute used here still exists.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.utils.json import dumps as kombu_dumps
from redis import exceptions as redis_exceptions

from prorl_celery.state._redis_raw import FailoverAwareConnection

#: the kombu releases (major.minor) this module was written and measured against
TESTED_WITH = ("5.7",)


class _QoS(kombu_redis.QoS):
    """kombu's Redis ack emulation (for the queues consumed with acks: RUN's), its two
    bookkeeping writes per delivered message (``ZADD unacked_index`` + ``HSET unacked``) and per
    ack (``HDEL`` + ``ZREM``) each sent as one pipeline without MULTI/EXEC (with MULTI/EXEC they
    were twelve of a job's Redis commands, ``python -m bench.overhead``).

    Atomicity buys nothing here. The restore sweep only looks at index entries older than the
    visibility timeout and restores a message only if its hash entry is there (an entry without
    one it just drops), so an ack removes the hash entry first: cut off halfway, it leaves an
    index entry the sweep drops, never a message restored after its ack. A delivery cut off
    halfway is the same loss as one whose reply never arrived. A restore keeps kombu's own
    WATCH/MULTI transaction.

    A delivery from a queue consumed without acks (``Queue(no_ack=True)``: INIT and EVAL) is
    never appended (kombu's ``basic_consume``), and Celery still calls ``message.ack()`` on it
    (kombu's no-ack check reads ``channel.no_ack_consumers``, which the virtual transport leaves
    None): such a tag is not in ``_delivered``, and its ack or reject sends nothing."""

    def append(self, message, delivery_tag) -> None:
        delivery = message.delivery_info
        raw = kombu_dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.channel.conn_or_acquire() as client:
            client.pipeline(transaction=False).zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                .hset(self.unacked_key, delivery_tag, raw).execute()
        kombu_virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag) -> None:
        if delivery_tag not in self._delivered:  # type: ignore[operator]  # consumed without acks (INIT/EVAL)
            return
        self._forget(delivery_tag)
        kombu_virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag, requeue: bool = False) -> None:
        if delivery_tag not in self._delivered:  # type: ignore[operator]  # no acks: gone for good
            return
        if requeue:  # back to the queue: kombu's transaction
            super().reject(delivery_tag, requeue=True)
            return
        self._forget(delivery_tag)
        kombu_virtual.QoS.ack(self, delivery_tag)

    def _forget(self, delivery_tag) -> None:
        with self.channel.conn_or_acquire() as client:
            client.pipeline(transaction=False).hdel(self.unacked_key, delivery_tag) \
                .zrem(self.unacked_index_key, delivery_tag).execute()


class _Channel(kombu_redis.Channel):
    """kombu's Redis channel, with one synchronous client per channel instead of one per call.

    Stock kombu builds a new ``redis.Redis`` for every publish, every delivery's unacked
    bookkeeping and every ack (``conn_or_acquire``): about 190 us of CPU each with redis-py 8
    (its response-callback table), nine times per job over the three stages. A client is
    thread-safe and draws its connections from the channel's pool, so one serves them all."""

    QoS = _QoS
    _sync_client = None

    def _create_client(self, asynchronous: bool = False):
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._sync_client
        if self._detached():
            # Celery's consumer, on a lost connection, collects the kombu Connection (its transport
            # lets go of it) and a channel closed after that restores its unacked messages: kombu
            # would build a pool from the connection's parameters (``_connparams``: None.hostname).
            # The last client's pool still knows the server; once Redis answers again the restore
            # puts the messages back on their queue, and until then it fails as a connection error,
            # which kombu and Celery recover from.
            if client is None:
                raise redis_exceptions.ConnectionError("the channel's broker connection is closed")
            return client
        if client is None or client.connection_pool is not self.pool:  # pools are renewed on reconnect
            client = self._sync_client = super()._create_client()
        return client

    def _detached(self) -> bool:
        """True once the channel's transport or the kombu Connection behind it is gone."""
        transport = self.connection
        return transport is None or transport.client is None


class RedisTransport(kombu_redis.Transport):
    Channel = _Channel


class _SentinelChannel(_Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its pool asks the sentinels for the primary) with the same
    patches: its ``_sentinel_managed_pool`` reads ``connection.client.alt``, so a channel closed
    after its connection would fail the same way. Its connections ask the sentinels for the
    primary on every reconnect (``FailoverAwareConnection``)."""

    connection_class = FailoverAwareConnection


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = _SentinelChannel


def transport_for(url: str) -> type | None:
    """Our Redis transport for a ``redis://``/``rediss://`` broker, our Sentinel transport for a
    ``sentinel://`` one, kombu's choice otherwise."""
    scheme = urlsplit(url.split(";", 1)[0]).scheme
    return {"redis": RedisTransport, "rediss": RedisTransport, "sentinel": SentinelTransport}.get(scheme)


def fetch_gate(qos: kombu_virtual.QoS) -> Callable[[], bool]:
    """What ``qos`` asks now before it fetches (the hub asks before each BRPOP)."""
    return qos.can_consume


def set_fetch_gate(qos: kombu_virtual.QoS, can_consume: Callable[[], bool]) -> None:
    """Make ``qos`` fetch only while ``can_consume()`` says so."""
    qos.can_consume = can_consume  # type: ignore[method-assign]
