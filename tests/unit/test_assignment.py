"""Two-phase assignment of LLM backends to rollout deployments: same node first, then round robin."""
from __future__ import annotations

from collections import Counter

import pytest

from prorl_celery.trainer.assignment import LOOPBACK, assign_backends, node_of, resolve_host

# host names resolved by a table, so the tests need no DNS
HOSTS = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3", "gpu-d": "10.0.0.4"}


def resolve(host: str) -> str:
    return HOSTS.get(host, host)


def assign(deployments, backends):
    return assign_backends(deployments, backends, resolve=resolve)


def test_same_node_first_then_round_robin():
    deployments = ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
    backends = ["http://10.0.0.2:8000/v1", "http://10.0.0.3:8000/v1", "http://10.0.0.1:8000/v1",
                "http://10.0.0.4:8000/v1", "http://10.0.0.3:8001/v1"]
    plan = assign(deployments, backends)
    # phase 1 gives each deployment its local backend; the three others alternate from the first
    assert plan == {
        "http://10.0.0.1:8080": ["http://10.0.0.1:8000/v1", "http://10.0.0.3:8000/v1",
                                 "http://10.0.0.3:8001/v1"],
        "http://10.0.0.2:8080": ["http://10.0.0.2:8000/v1", "http://10.0.0.4:8000/v1"],
    }


def test_round_robin_evens_out_a_lopsided_first_phase():
    # three local backends on A: the remote ones all go to B until B catches up
    deployments = ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
    local = [f"http://10.0.0.1:{8000 + i}/v1" for i in range(3)]
    remote = [f"http://10.0.0.3:{8000 + i}/v1" for i in range(5)]
    plan = assign(deployments, local + remote)
    assert plan["http://10.0.0.1:8080"] == local + [remote[3]]
    assert plan["http://10.0.0.2:8080"] == remote[:3] + [remote[4]]


def test_host_names_are_matched_by_address():
    plan = assign(["http://gpu-a:8080", "http://10.0.0.2:8080"],
                  ["http://10.0.0.1:9000/v1", "http://gpu-b:9000/v1"])
    assert plan == {"http://gpu-a:8080": ["http://10.0.0.1:9000/v1"],
                    "http://10.0.0.2:8080": ["http://gpu-b:9000/v1"]}


def test_several_deployments_on_one_node_share_its_backends():
    deployments = ["http://10.0.0.1:8080", "http://10.0.0.1:8081", "http://10.0.0.2:8080"]
    backends = [f"http://10.0.0.1:{9000 + i}/v1" for i in range(4)]
    plan = assign(deployments, backends)
    assert [len(plan[d]) for d in deployments] == [2, 2, 0]


@pytest.mark.parametrize("n_deployments, n_backends", [(1, 5), (3, 3), (3, 10), (4, 2), (5, 17)])
def test_every_backend_exactly_once_and_shares_even_without_locality(n_deployments, n_backends):
    deployments = [f"http://10.1.0.{i}:8080" for i in range(n_deployments)]
    backends = [f"http://10.2.0.{i}:8000/v1" for i in range(n_backends)]
    plan = assign(deployments, backends)
    assigned = [b for share in plan.values() for b in share]
    assert sorted(assigned) == sorted(backends)
    sizes = [len(share) for share in plan.values()]
    assert max(sizes) - min(sizes) <= 1
    # plain round robin: backend i goes to deployment i mod D
    assert all(plan[deployments[i % n_deployments]].count(b) == 1 for i, b in enumerate(backends))


def test_duplicates_are_ignored_and_empty_deployments_rejected():
    plan = assign(["http://10.0.0.1:8080", "http://10.0.0.1:8080"],
                  ["http://10.0.0.1:8000/v1", "http://10.0.0.1:8000/v1"])
    assert plan == {"http://10.0.0.1:8080": ["http://10.0.0.1:8000/v1"]}
    with pytest.raises(ValueError):
        assign([], ["http://10.0.0.1:8000/v1"])
    assert Counter(len(s) for s in assign(["http://10.0.0.9:1"], []).values()) == {0: 1}


def test_real_resolution_of_loopback_and_literals():
    assert resolve_host("127.0.0.1") == resolve_host("localhost") == resolve_host("127.3.4.5") == LOOPBACK
    assert resolve_host("10.0.0.7") == "10.0.0.7"
    assert resolve_host("no-such-host.invalid") == "no-such-host.invalid"
    assert node_of("gateway-host:8080", resolve) == "gateway-host"
    assert node_of("http://[::1]:8000/v1") == LOOPBACK
    plan = assign_backends(["http://localhost:8080", "http://10.9.9.9:8080"],
                           ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"])
    assert plan["http://localhost:8080"] == ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"]
