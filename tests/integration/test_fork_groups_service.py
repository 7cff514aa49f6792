"""Fork groups on the real service (gateway, Celery workers, Redis, a scripted LLM server):
``POST /jobs/<id>/fork`` is idempotent under a client-given ``group_id`` and refuses a different
request under a taken one; the client's own retries never start a second set; and the DAPO
collector collects a fork group, and samples a filtered group again by forking one of its members.

The jobs are math problems without tools (no sandbox): the scripted server's first reply has no
boxed answer, so the handler asks again, and its second reply answers by the request's seed
(``seed_mod``), right for an odd seed and wrong for an even one. Forks of one job share its
prompt and first turn and get seeds ``seed + 1 + i``: their answers differ where the source's
group's (all even seeds) did not.
"""
from __future__ import annotations

import httpx
import pytest
import redis

from prorl_celery.core.errors import Conflict
from prorl_celery.state import keys
from prorl_celery.trainer import CollectorConfig, DAPOCollector, ForkOf, ForkPoint, RolloutClient
from prorl_celery.wire import derived
from tests.support.services import LLMServer, rules_file, start_llm_server

THINK = "Let me think about it."
RULES = [{"match": "FORKS", "scope": "prompt", "seed_mod": [2, 1], "replies": [THINK, "So \\boxed{1}."]},
         {"match": "FORKS", "scope": "prompt", "replies": [THINK, "So \\boxed{2}."]}]


@pytest.fixture(scope="module")
def llm(qwen3_tokenizer, tmp_path_factory) -> LLMServer:
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("forks-llm"), "forks", rules=rules_file(RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(gateway, llm):
    llm.reset()
    gateway.post("/add_llm_server", json={"address": llm.address()}).raise_for_status()
    return gateway


def problem(name: str) -> dict:
    return {"data_source": "math", "problem": f"FORKS {name}: what is 3 - 2?", "answer": "1", "max_iterations": 3}


def finished_job(service, name: str, seed: int = 0) -> dict:
    """A two-turn job (the first turn thinks, the second answers by the seed), ended."""
    job_id = service.submit(problem(name), sampling_params={"max_tokens": 32, "seed": seed})
    result = service.result(job_id, wait=60)
    assert result["status"] == "completed" and result["trajectory"]["num_turns"] == 2, result["error"]
    return result


def jobs_in_redis(service) -> int:
    return sum(service.get("/status").json()["jobs"].values())


def fork(service, job_id: str, **body) -> httpx.Response:
    return service.post(f"/jobs/{job_id}/fork", json=body)


# -- idempotent fork requests ------------------------------------------------------------------------

def test_a_repeated_fork_request_answers_the_same_jobs_and_starts_none(service):
    source = finished_job(service, "repeat")
    first = fork(service, source["job_id"], turn=1, count=2, group_id="g-repeat")
    again = fork(service, source["job_id"], turn=1, count=2, group_id="g-repeat")
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    ids = ["g-repeat-0", "g-repeat-1"]
    assert [j["job_id"] for j in first.json()["jobs"]] == [j["job_id"] for j in again.json()["jobs"]] == ids
    assert [j["created"] for j in first.json()["jobs"]] == [True, True]
    assert [j["created"] for j in again.json()["jobs"]] == [False, False]
    assert again.json()["group_id"] == "g-repeat"
    assert jobs_in_redis(service) == 3  # the source and one set of forks
    forks = [service.result(job_id) for job_id in ids]
    for index, result in enumerate(forks):
        assert result["fork"] == {"of": source["job_id"], "turn": 1, "group": "g-repeat", "index": index, "count": 2,
                                  "shared_turns": 1, "shared_tokens": result["fork"]["shared_tokens"],
                                  "observations_checked": 1}  # the handler's follow-up after turn 1
        assert result["fork"]["shared_tokens"] == source["trajectory"]["turns"][0]["output_len"] > 0
    assert [f["reward"] for f in forks] == [1.0, 0.0]  # seeds 1 and 2: each its own sampling after turn 1


def test_a_group_id_taken_by_another_request_is_a_conflict_that_starts_nothing(service):
    source = finished_job(service, "taken")
    other = finished_job(service, "other")
    assert fork(service, source["job_id"], turn=1, count=2, group_id="g-taken").status_code == 202
    for body, named in [({"turn": 0, "count": 2}, "turn 1 (this request: 0)"),
                        ({"turn": 1, "count": 3}, "count 2 (this request: 3)"),
                        ({"turn": 1, "count": 1}, "count 2 (this request: 1)")]:
        refused = fork(service, source["job_id"], group_id="g-taken", **body)
        assert refused.status_code == 409 and refused.json()["code"] == "conflict", refused.text
        assert named in refused.json()["message"], refused.json()
    elsewhere = fork(service, other["job_id"], turn=1, count=2, group_id="g-taken")
    assert elsewhere.status_code == 409 and f"of {source['job_id']!r}" in elsewhere.json()["message"]
    malformed = fork(service, source["job_id"], turn=1, count=2, group_id="not a valid id")
    assert malformed.status_code == 400 and malformed.json()["message"].startswith("group_id: "), malformed.text
    with RolloutClient(service.cluster.gateway_url) as client, pytest.raises(Conflict, match="g-taken"):
        client.fork(source["job_id"], 0, 2, group_id="g-taken")
    state = redis.Redis.from_url(service.cluster.state_url)
    assert not state.exists(keys.job("g-taken-2")) and jobs_in_redis(service) == 4  # two sources, two forks


class LosesFirstForkReply(httpx.AsyncHTTPTransport):
    """The real network, except that the first fork request's reply is lost after the gateway
    served it (a timeout, a proxy cut): the client must retry it."""

    lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path.endswith("/fork") and not self.lost:
            await response.aread()  # the gateway answered: its forks exist
            await response.aclose()
            self.lost += 1
            raise httpx.ReadError("reply lost", request=request)
        return response


def test_the_clients_retry_after_a_lost_reply_finds_the_forks_it_started(service):
    source = finished_job(service, "lost")
    transport = LosesFirstForkReply()
    with RolloutClient(service.cluster.gateway_url, transport=transport) as client:
        ids = client.fork(source["job_id"], 1, 2)  # no group_id: the client makes one, once
        assert transport.lost == 1 and client.aio.retried == 1
    assert len(ids) == 2 and ids[0].startswith(f"{source['job_id']}-fork1-") and ids[1] == ids[0][:-1] + "1"
    assert jobs_in_redis(service) == 3  # the lost attempt's forks, found again: no second set
    assert all(service.result(job_id)["fork"]["of"] == source["job_id"] for job_id in ids)


def test_a_request_racing_another_under_its_group_id_cancels_what_it_started(app_gateway, llm):
    """Two different requests under one group_id at once: the one that finds the other's jobs
    only after its own submit refuses (409) and cancels the forks it created."""
    app_gateway.post("/add_llm_server", json={"address": llm.address()})
    source_id = app_gateway.submit(problem("race"), sampling_params={"max_tokens": 32})
    assert app_gateway.result(source_id)["status"] == "completed"
    services = app_gateway.application.extensions["prorl"]

    def submit_after_the_other(specs):  # the other request lands between this one's check and submit
        other = app_gateway.post(f"/jobs/{source_id}/fork", json={"turn": 1, "count": 2, "group_id": "g-race"})
        assert other.status_code == 202, other.text
        return services.intake.submit(specs)

    with pytest.raises(Conflict, match="count 2 \\(this request: 3\\)"):
        derived.submit_forks(services.store, services.journal, submit_after_the_other, source_id, 1, 3, "g-race")
    assert app_gateway.result("g-race-2")["status"] == "cancelled"  # this request's own
    assert [app_gateway.result(f"g-race-{i}")["status"] for i in (0, 1)] == ["completed", "completed"]


# -- the DAPO collector --------------------------------------------------------------------------------

def seeded(group, index: int) -> dict:
    """Even seeds: every rollout of a fresh group answers wrong (a group the filter drops)."""
    instance = {**group.instance, "instance_id": group.prompt_id, "trajectory_id": f"{group.prompt_id}-{index}"}
    return {"instance": instance, "sampling_params": {"max_tokens": 32, "seed": 2 * index}}


def requests_for(llm: LLMServer, marker: str, tokenizer) -> list[dict]:
    return [r for r in llm.log() if marker in tokenizer.decode(r["prompt_ids"])]


def test_the_collector_samples_a_filtered_group_again_by_forking_a_member(service, llm, qwen3_tokenizer):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer)
    config = CollectorConfig(group_size=2, batch_groups=1, fork_filtered=1, fork_at=0.5)
    with RolloutClient(service.cluster.gateway_url, poll_s=5) as client, \
            DAPOCollector(client, [problem("dapo")], config, make_request=seeded, run_id="fg") as dapo:
        batch = dapo.next_batch()
    (group,) = batch.groups
    source = "fg-0-0-0"  # the filtered group's member 0, forked at turn 1 of its 2
    assert group.fork == ForkPoint(source, 1, "fg-1-fork", parent=0) and group.prompt_id == "p0"
    assert group.rewards == [1.0, 0.0]  # seeds 1 and 2 after the shared first turn
    assert (batch.stats.filtered, batch.stats.forked, batch.stats.submitted) == (1, 1, 4)
    for rollout in group.ordered:
        assert (rollout.fork_of, rollout.fork_turn, rollout.shared_turns) == (source, 1, 1)
        (sample,) = rollout.samples
        trajectory = rollout.result["trajectory"]
        first, own = trajectory["turns"][0], trajectory["turns"][1]
        assert sample.shared_tokens == first["output_len"] and sample.fork_of == source
        # the source's thinking is not trained on; the fork's own answer is
        assert not any(sample.response_mask[:first["output_start"] + first["output_len"]])
        assert all(sample.response_mask[own["output_start"]:own["output_start"] + own["output_len"]])
        assert trajectory["response_mask"][0] == 1  # the result itself keeps the mask as generated
    # the shared turn was generated for the source group only: each fork asked for its answer alone
    asked = requests_for(llm, "FORKS dapo", tokenizer)
    assert len(asked) == 2 * 2 + 2 and sum(THINK in tokenizer.decode(r["output_ids"]) for r in asked) == 2
    assert jobs_in_redis(service) == 4


def test_the_collector_collects_a_fork_group_from_its_prompt_stream(service):
    source = finished_job(service, "stream", seed=4)
    with RolloutClient(service.cluster.gateway_url, poll_s=5) as client, \
            DAPOCollector(client, [ForkOf(source["job_id"], 1, prompt_id="tree")], group_size=3,
                          batch_groups=1, run_id="fs") as dapo:
        batch = dapo.next_batch()
    (group,) = batch.groups
    assert group.prompt_id == "tree" and group.fork == ForkPoint(source["job_id"], 1, "fs-0-fork")
    assert group.rewards == [1.0, 0.0, 1.0]  # seeds 5, 6, 7
    assert [r.job_id for r in group.ordered] == ["fs-0-fork-0", "fs-0-fork-1", "fs-0-fork-2"]
    assert all(r.result["fork"]["group"] == "fs-0-fork" for r in group.ordered)
