"""Stage messages on a real redis-server broker: what ``celery_app.publish`` sends and what
the Redis transport's ack emulation writes.

``publish`` builds the stage task's Celery protocol-2 message itself (not through
``send_task``): it must be the message ``send_task`` builds, field for field but for its ids,
or a worker would not run it as the same task. With task events on it is ``send_task``'s, so
its task-sent event still reaches Flower. The ack emulation (``celery_app._QoS``) keeps kombu's
keys without MULTI/EXEC: a delivered message is in ``unacked`` until its ack, and one never
acked (its worker died) is restored to its queue after the visibility timeout.
"""
from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Queue

from prorl_celery.celery_app import create_celery, enqueue, publish
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import Stage
from prorl_celery.state.store import SENT_HEADER

DB = 12
#: what differs between any two messages: their ids, and the process that sent them
IDS = ("id", "root_id", "correlation_id", "delivery_tag", "origin")


@pytest.fixture
def broker(redis_url):
    url = f"{redis_url}/{DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.flushdb()


def read(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The messages in ``queue``, oldest first, their body decoded."""
    messages = [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]
    for message in messages:
        message["body"] = json.loads(base64.b64decode(message["body"]))
    return messages


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    headers = {k: v for k, v in message["headers"].items() if k not in IDS}
    properties = {k: v for k, v in message["properties"].items() if k not in IDS}
    return {**message, "headers": headers, "properties": properties}


def test_publish_sends_the_message_send_task_builds(broker) -> None:
    url, client = broker
    app = create_celery(Settings(redis_url=url, broker_url=url), set_as_current=False)
    try:
        app.send_task("prorl.run", args=["job-a"], queue="run.node-1")
        enqueue(Stage.RUN, "job-b", queue="run.node-1", celery=app)
        publish([(Stage.RUN, "run.node-1", "job-c"), (Stage.RUN, "run.node-1", ["job-d", "job-e"])], celery=app)
    finally:
        app.close()
    reference, *ours = read(client, "run.node-1")
    assert [m["body"][0] for m in ours] == [["job-b"], ["job-c"], [["job-d", "job-e"]]]
    for message in ours:
        assert message["headers"]["id"] == message["headers"]["root_id"] == message["properties"]["correlation_id"]
        assert message["headers"]["id"] != reference["headers"]["id"]
        # send_task leaves ignore_result to the task (None) and names its app as reply_to;
        # publish says it (the app ignores results anyway) and needs no reply
        expected = without_ids(reference)
        # and it says when it was sent (the reaper's lost-message rule: leases.lost_messages)
        assert abs(message["headers"][SENT_HEADER] - time.time()) < 60
        expected["headers"] = {**expected["headers"], "ignore_result": True,
                               "argsrepr": repr(message["body"][0]), SENT_HEADER: message["headers"][SENT_HEADER]}
        expected["properties"] = {**expected["properties"], "reply_to": ""}
        expected["body"] = [message["body"][0], *reference["body"][1:]]
        assert without_ids(message) == expected
    assert len({m["headers"]["id"] for m in ours}) == 3


def test_with_task_events_publish_sends_the_task_sent_event(broker) -> None:
    url, client = broker
    app = create_celery(Settings(redis_url=url, broker_url=url, task_events=True), set_as_current=False)
    events = client.pubsub()
    events.psubscribe("*celeryev*")  # the events exchange's fanout channel
    try:
        assert events.get_message(timeout=5)["type"] == "psubscribe"
        publish([(Stage.EVAL, None, "job-a"), (Stage.EVAL, None, "job-b")], celery=app)
        sent = []
        deadline = time.monotonic() + 10
        while len(sent) < 2 and time.monotonic() < deadline:
            event = events.get_message(timeout=1)
            if event and event["type"] == "pmessage":
                body = json.loads(base64.b64decode(json.loads(event["data"])["body"]))
                if body["type"] == "task-sent":
                    sent.append(body["uuid"])
    finally:
        events.close()
        app.close()
    assert sorted(sent) == sorted(m["headers"]["id"] for m in read(client, Stage.EVAL.value))


def test_ack_emulation_keeps_a_delivery_until_its_ack_and_restores_an_unacked_one(broker) -> None:
    url, client = broker
    app = create_celery(Settings(redis_url=url, broker_url=url, visibility_timeout_s=1), set_as_current=False)
    try:
        publish([(Stage.INIT, None, "job-a"), (Stage.INIT, None, "job-b")], celery=app)
    finally:
        app.close()
    received = []
    with Connection(url, transport=app.conf.broker_transport,
                    transport_options=app.conf.broker_transport_options) as connection:
        channel = connection.channel()
        with Consumer(channel, [Queue(Stage.INIT.value)], callbacks=[lambda body, m: received.append(m)],
                      accept=["json"]):
            client.config_resetstat()  # after the queue's declaration (its LLEN pipeline is a MULTI)
            connection.drain_events(timeout=5)
            connection.drain_events(timeout=5)
            assert [m.payload[0] for m in received] == [["job-a"], ["job-b"]]
            tags = {m.delivery_tag for m in received}
            assert set(map(bytes.decode, client.hkeys("unacked"))) == tags
            assert set(map(bytes.decode, client.zrange("unacked_index", 0, -1))) == tags
            received[0].ack()
            left = {received[1].delivery_tag}
            assert set(map(bytes.decode, client.hkeys("unacked"))) == left
            assert set(map(bytes.decode, client.zrange("unacked_index", 0, -1))) == left
            commands = client.info("commandstats")
            assert "cmdstat_multi" not in commands and "cmdstat_exec" not in commands
            # the second is never acked, as if its worker died (still inside the channel: a
            # closing channel restores its own deliveries): past the visibility timeout the
            # restore sweep puts it back on its queue
            time.sleep(1.5)
            channel.qos.restore_visible(num=10, interval=1)
            assert [m["body"][0] for m in read(client, Stage.INIT.value)] == [["job-b"]]
            assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0
