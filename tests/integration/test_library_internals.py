"""The libraries whose internals we patch are the versions the patches were written for, and
still have every internal the patches use (the raw redis calls against the session's server)."""
from __future__ import annotations

import importlib.metadata

import pytest

from prorl_celery.state import _redis_raw
from prorl_celery.worker import _celery, _kombu

PATCHES = {"celery": _celery, "kombu": _kombu, "redis": _redis_raw}


@pytest.mark.parametrize("distribution", sorted(PATCHES))
def test_the_installed_release_is_one_the_patches_were_written_for(distribution):
    version = importlib.metadata.version(distribution)
    module = PATCHES[distribution]
    minor = ".".join(version.split(".")[:2])
    assert minor in module.TESTED_WITH, (
        f"{distribution} {version} is installed, but {module.__name__} patches its internals and was "
        f"written for {distribution} {', '.join(module.TESTED_WITH)}: check every patch it lists against "
        f"{distribution} {version}, then add {minor} to its TESTED_WITH (and widen requirements/service.txt)")


def test_kombu_still_has_what_the_patches_use():
    from kombu.transport import redis as kombu_redis
    from kombu.transport import virtual

    assert issubclass(_kombu.RedisTransport, kombu_redis.Transport)
    for name in ("append", "ack", "reject", "can_consume", "unacked_key", "unacked_index_key"):
        assert hasattr(kombu_redis.QoS, name), f"kombu's Redis QoS lost {name}"
    assert "_delivered" in virtual.QoS.__init__.__code__.co_names, "kombu's QoS no longer keeps _delivered"
    assert hasattr(kombu_redis.Channel, "_create_client") and hasattr(kombu_redis.Channel, "conn_or_acquire")
    assert "_raw" in virtual.Message.__init__.__code__.co_names, "kombu's Message no longer keeps _raw"


def test_celery_still_has_what_the_patches_use():
    from celery import Celery
    from celery.worker import state

    assert hasattr(state.reserved_requests, "__len__") and hasattr(state.reserved_requests, "__iter__")
    assert isinstance(state.reserved_requests.data, set)  # reserved_snapshot copies it in one step
    app = Celery("probe", set_as_current=False)
    assert hasattr(app, "thread_oid") and hasattr(app, "backend")
    _celery.share_backend(app)
    assert app.backend is app._backend_cache and app.thread_oid == app._local.oid
    from celery.worker.consumer import Consumer
    assert "ensure_connection" in Consumer.ensure_connected.__code__.co_names, \
        "Celery's consumer no longer reconnects through Connection.ensure_connection: re-check StageConsumer"
    assert issubclass(_celery.StageConsumer, Consumer)


def test_the_stage_consumer_reconnects_on_its_own_waits():
    from kombu import Connection

    class Probe(Connection):
        def ensure_connection(self, *args, **kwargs):
            self.seen = (args, kwargs)
            return self

    conn = Probe("redis://127.0.0.1:1/0")
    _celery.with_fast_reconnect(conn)
    conn.ensure_connection("errback", 3, callback=None)  # as Celery's Consumer.ensure_connected calls it
    assert conn.seen == (("errback", 3), {"callback": None, "interval_start": _celery.RECONNECT_START_S,
                                          "interval_step": _celery.RECONNECT_STEP_S,
                                          "interval_max": _celery.RECONNECT_MAX_S})


def test_redis_py_still_reconnects_where_the_failover_patch_steps_in():
    """``FailoverAwareConnection`` re-resolves the primary in ``connect_check_health``: the call
    ``send_packed_command`` reconnects through, bypassing the Sentinel connection's ``connect``."""
    from redis.connection import AbstractConnection
    from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

    assert "connect_check_health" in AbstractConnection.send_packed_command.__code__.co_names, \
        "redis-py no longer reconnects through connect_check_health: re-check FailoverAwareConnection"
    assert issubclass(_redis_raw.FailoverAwareConnection, SentinelManagedConnection)
    assert hasattr(SentinelConnectionPool, "get_master_address")
    assert "is_master" in SentinelConnectionPool.__init__.__code__.co_names
    assert _kombu.SentinelTransport.Channel.connection_class is _redis_raw.FailoverAwareConnection


def test_redis_connection_calls_answer_as_the_listener_reads_them(redis_url):
    import redis

    pool = redis.ConnectionPool.from_url(redis_url, decode_responses=True)
    connection = pool.get_connection()
    try:
        assert _redis_raw.command(connection, "SET", "prorl-internals-probe", "1") == "OK"
        assert _redis_raw.commands(connection, [("GET", "prorl-internals-probe"), ("DEL", "prorl-internals-probe")]) \
            == ["1", 1]
    finally:
        pool.release(connection)
        pool.disconnect()


def delivered_unacked(url: str, queue_name: str, count: int):
    """A kombu Connection on our transport whose consumer holds ``count`` messages delivered with
    acks and not acked, as a RUN worker holds the stages it fetched and has not yet claimed."""
    from kombu import Connection, Exchange, Queue

    connection = Connection(url, transport=_kombu.RedisTransport)
    queue = Queue(queue_name, Exchange(queue_name), queue_name)
    with connection.Producer() as producer:
        for i in range(count):
            producer.publish({"i": i}, exchange=queue.exchange, routing_key=queue_name, declare=[queue])
    held: list = []
    consumer = connection.Consumer([queue], callbacks=[lambda body, message: held.append(message)], no_ack=False)
    consumer.consume()
    while len(held) < count:
        connection.drain_events(timeout=5)
    return connection, consumer.channel, held


def test_a_channel_closed_after_its_connection_restores_its_unacked_messages(redis_url):
    """Celery's consumer, on a lost broker connection, collects the kombu Connection (its transport
    lets go of it) and the channel is closed after that: kombu's own client path then built a pool
    from parameters that were gone and raised AttributeError ('NoneType' object has no attribute
    'hostname'), which killed the RUN worker on a Redis restart (issue 40). The channel's client
    must put the unacked messages back on their queue instead."""
    import redis

    state = redis.Redis.from_url(redis_url)
    state.delete("internals-restore", "unacked", "unacked_index")
    connection, channel, held = delivered_unacked(redis_url, "internals-restore", 3)
    held[0].ack()
    connection._do_close_transport()  # what Connection.collect() does after it closed what it could
    channel.close()  # raised AttributeError before the fix
    assert state.llen("internals-restore") == 2, "the two unacked messages were not put back on their queue"
    assert state.hlen("unacked") == 0 and state.zcard("unacked_index") == 0


def test_a_detached_channel_without_a_server_fails_as_a_connection_error(tmp_path):
    """The same close while Redis is down: a connection error (kombu and Celery recover from it,
    and the messages stay in the unacked hash for the visibility sweep), never AttributeError."""
    import redis

    from tests.support.aof_redis import AofRedis

    server = AofRedis(tmp_path / "redis")
    server.start()
    try:
        connection, channel, held = delivered_unacked(server.url, "internals-down", 2)
        server.kill()
        connection._do_close_transport()
        with pytest.raises(redis.exceptions.ConnectionError):
            channel.close()
        server.start()
        assert redis.Redis.from_url(server.url).hlen("unacked") == 2, "an unacked message was lost while Redis was down"
    finally:
        server.stop()
