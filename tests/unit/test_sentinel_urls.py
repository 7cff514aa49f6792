"""``sentinel://`` URLs (docs/running.md, "Redis Sentinel"): one URL in kombu's form names the
sentinels for the broker and the state alike."""
from __future__ import annotations

from pathlib import Path

import pytest

from prorl_celery.dev.local import _with_db
from prorl_celery.dev.sentinel import sentinel_config
from prorl_celery.state.connection import SENTINEL_PORT, SentinelURL, is_sentinel, parse_sentinel_url
from prorl_celery.worker._kombu import RedisTransport, SentinelTransport, transport_for

THREE = "sentinel://:s3cret@10.0.0.1:26380/1;sentinel://10.0.0.2;sentinel://10.0.0.3:26381"


def test_a_sentinel_url_names_every_sentinel_the_database_and_the_primary_password():
    assert parse_sentinel_url(THREE) == SentinelURL(
        (("10.0.0.1", 26380), ("10.0.0.2", SENTINEL_PORT), ("10.0.0.3", 26381)), db=1, password="s3cret")
    assert parse_sentinel_url("sentinel://u:p%40ss@h:1;") == SentinelURL((("h", 1),), 0, "u", "p@ss")


@pytest.mark.parametrize(("url", "says"), [
    ("sentinel://h:1;redis://h:2", "every part must be sentinel://host:port"),
    ("sentinel://h:1/zero", "the database number"),
    ("sentinel://;", "every part must be sentinel"),
])
def test_a_malformed_sentinel_url_names_its_fault(url, says):
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


def test_only_sentinel_urls_go_to_the_sentinel_transport():
    assert is_sentinel(THREE) and not is_sentinel("redis://h:6379/0") and not is_sentinel("rediss://h/0")
    assert transport_for(THREE) is SentinelTransport
    assert transport_for("redis://h:6379/0") is RedisTransport and transport_for("rediss://h/0") is RedisTransport
    assert transport_for("amqp://h//") is None


def test_the_launcher_puts_broker_and_state_in_databases_of_every_part():
    assert _with_db("sentinel://a:1;sentinel://b:2", 1) == "sentinel://a:1/1;sentinel://b:2/1"
    assert _with_db("sentinel://:pw@a:1/0;sentinel://b:2", 0) == "sentinel://:pw@a:1/0;sentinel://b:2/0"


def test_a_sentinel_watches_the_primary_under_the_quorum_of_two():
    config = sentinel_config(26379, Path("/x"), "prorl", 6380, down_after_ms=2000,
                             failover_timeout_ms=10000)
    assert "sentinel monitor prorl 127.0.0.1 6380 2" in config.splitlines()
    assert "sentinel down-after-milliseconds prorl 2000" in config.splitlines()
