"""The dashboard of the gateway app (in this process, Flask's test client, on the real cluster):
its JSON matches /status, the jobs list stays bounded with 10,000 jobs stored, the trajectory
viewer escapes model text, and sign-in works when the gateway has tokens."""
from __future__ import annotations

import html
import re

import pytest
import redis

from api import dashboard_data
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.llm.tokenizer import load_tokenizer
from prorl_celery.state import keys
from prorl_celery.state.store import JobRecord, JobStore, outcome
from tests.support.app import close_app, make_app

XSS = "<script>window.__xss=1</script>"
PATCH = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = <b>3</b>\n"


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture
def store(cluster, gateway) -> JobStore:
    """The gateway's job store, written directly (the gateway fixture has flushed it)."""
    return JobStore(redis.Redis.from_url(cluster.state_url, decode_responses=True), result_ttl_s=3600)


def finish_job(store: JobStore, job_id: str, *, task: str = "math", fields: dict | None = None,
               reward: float = 1.0) -> None:
    """Create a job and walk it through every stage to ``completed``, as the workers would."""
    store.create(job_id, {"task": task, "instance": {"problem": "p"}, "sampling_params": {}, "budget_s": 60,
                          "attempt": 1})
    for stage in Stage:
        assert store.claim_stage(job_id, stage).ok
        if stage.next:
            assert store.hand_over(job_id, stage).ok
    assert store.finish(job_id, JobStatus.COMPLETED, {"reward": reward, **(fields or {})}).ok


def test_overview_json_reports_what_status_reports(gateway, store):
    finish_job(store, "done-1", reward=1.0)
    finish_job(store, "done-2", reward=0.0)
    store.create("waiting", {"task": "math", "budget_s": 60})
    overview = gateway.get("/dashboard/api/overview").json
    status = gateway.get("/status").json
    for field in ("state", "stages", "jobs", "generation", "backends", "tasks", "warm_pool"):
        assert overview["status"][field] == status[field], field
    assert {w["name"] for w in overview["status"]["workers"]} == {w["name"] for w in status["workers"]}
    assert overview["status"]["jobs"]["completed"] == 2 and overview["status"]["stages"]["init"]["queued"] == 1
    series = overview["series"]
    assert len(series["completed"]) == dashboard_data.SERIES_MINUTES and sum(series["completed"]) == 2
    # both ended in the same minute: the last one, or the one before when a minute began since
    assert [reward for reward in series["mean_reward"] if reward is not None][-1] == 0.5
    nodes = {w["node"] for w in status["workers"]}
    assert set(overview["sandboxes"]) == nodes
    # the nodes card: every node with a live worker is up (nodes are written with the same beat)
    live = {w["node"] for w in overview["status"]["workers"]}
    states = {n["node"]: n["state"] for n in overview["status"]["nodes"] if n["node"] in live}
    assert states == dict.fromkeys(live, "up")
    page = gateway.get("/dashboard")
    assert page.status_code == 200 and 'id="initial-data"' in page.text and 'id="warm-pools"' in page.text
    pending = gateway.get("/dashboard/jobs/waiting")
    assert pending.status_code == 200 and "still running" in pending.text and "No token trajectory" in pending.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_minute_series_counts_every_job_that_ended(gateway, store):
    """More jobs end within a minute or two than the old sample of recent records held (3,000):
    the chart counts all of them, with the completed ones' mean reward."""
    total = 3200
    cancelled = range(0, total, 5)
    for i in range(total):
        job_id = f"bulk-{i:04d}"
        if i in cancelled:
            store.create(job_id, {"task": "math", "budget_s": 60})
            assert store.cancel(job_id).ok
        else:
            finish_job(store, job_id, reward=float(i % 2))
    series = gateway.get("/dashboard/api/overview").json["series"]
    assert sum(series["completed"]) == total - len(cancelled) and sum(series["not_completed"]) == len(cancelled)
    assert series["minutes"][-1] - series["minutes"][0] == 60 * (dashboard_data.SERIES_MINUTES - 1)
    reward_total = sum(r * c for r, c in zip(series["mean_reward"], series["completed"]) if c)
    right = sum(1 for i in range(total) if i % 2 and i not in cancelled)  # odd i were right, even i wrong
    assert right == 1280 and reward_total == pytest.approx(right)
    busy = next(start for start, count in zip(series["minutes"], series["completed"]) if count)
    assert 0 < store.redis.ttl(keys.minute_stats(busy)) <= keys.MINUTE_STATS_TTL_S


def test_stage_percentiles_interpolate_the_histogram():
    # 10 observations: 4 at <= 0.1 s, 6 more at <= 1 s
    histogram = {"0.01": 0, "0.05": 0, "0.1": 4, "0.5": 4, "1.0": 10, "5.0": 10, "10.0": 10, "30.0": 10,
                 "60.0": 10, "300.0": 10, "1800.0": 10, "+Inf": 10, "sum": 5.0}
    numbers = dashboard_data.stage_percentiles(histogram)
    assert numbers["count"] == 10 and numbers["mean"] == 0.5
    assert numbers["p50"] == pytest.approx(0.5 + 0.5 * (1 / 6))
    assert numbers["p90"] == pytest.approx(0.5 + 0.5 * (5 / 6))
    assert dashboard_data.stage_percentiles({})["p50"] is None
    assert dashboard_data.stage_percentiles({"+Inf": 2, "1800.0": 0, "sum": 9000})["p99"] == 1800.0


def test_jobs_list_rows_show_the_records_fields(gateway, store):
    finish_job(store, "done", fields={"reward": 1.0, "backend": "http://b:1", "generation": 3})
    store.create("broken", {"task": "code", "budget_s": 60, "attempt": 2})
    assert store.claim_stage("broken", Stage.INIT).ok
    assert store.finish("broken", JobStatus.FAILED, outcome("init", "ValueError: bad")).ok
    broken, done = gateway.get("/dashboard/api/jobs").json["jobs"]
    assert (broken["job_id"], broken["task"], broken["status"], broken["stage"]) == ("broken", "code", "failed", None)
    # the stage's outcome as the store wrote it, read back through the store's record
    assert (broken["critical_error"], broken["attempt"], broken["reward"], broken["backend"]) == ("init", 2, None, None)
    assert broken["timing"]["init_s"] > 0 and broken["ended_at"] >= broken["created_at"] > 0
    assert (done["critical_error"], done["reward"], done["backend"], done["generation"]) == (None, 1.0, "http://b:1", 3)
    assert set(dashboard_data.ROW_FIELDS) <= set(JobRecord.__struct_fields__)  # a renamed field reads as unset


def test_jobs_list_is_bounded_and_paginates_with_10000_jobs(gateway, store):
    pipe_ids = [f"job-{i:05d}" for i in range(10_000)]
    for job_id in pipe_ids:
        store.create(job_id, {"task": "math" if int(job_id[-1]) % 2 else "noop", "budget_s": 60})
    for old in ("job-00003", "job-00010", "job-00500"):  # deep in the index: far past one scan
        assert store.cancel(old).ok
    newest_first = list(reversed(pipe_ids))

    first = gateway.get("/dashboard/api/jobs").json
    assert [j["job_id"] for j in first["jobs"]] == newest_first[:dashboard_data.PAGE_SIZE]
    assert first["scanned"] == dashboard_data.PAGE_SIZE and first["next"]
    second = gateway.get("/dashboard/api/jobs", query_string={"cursor": first["next"], "limit": 120}).json
    assert [j["job_id"] for j in second["jobs"]] == newest_first[50:170]

    odd = gateway.get("/dashboard/api/jobs", query_string={"task": "math"}).json
    assert [j["job_id"] for j in odd["jobs"]] == [i for i in newest_first if int(i[-1]) % 2][:50]

    # a rare status: each request examines at most SCAN_LIMIT ids and hands back a cursor
    found, cursor, requests = [], None, 0
    while True:
        params = {"status": "cancelled", **({"cursor": cursor} if cursor else {})}
        page = gateway.get("/dashboard/api/jobs", query_string=params)
        assert page.status_code == 200, page.text
        body = page.json
        assert body["scanned"] <= dashboard_data.SCAN_LIMIT
        found += [j["job_id"] for j in body["jobs"]]
        requests += 1
        cursor = body["next"]
        if not cursor:
            break
    assert found == ["job-00500", "job-00010", "job-00003"]
    assert requests >= 10_000 // dashboard_data.SCAN_LIMIT

    listing = gateway.get("/dashboard/jobs")
    assert listing.status_code == 200
    assert len(re.findall(r'<tr data-job-id="', listing.text)) == dashboard_data.PAGE_SIZE
    assert 'id="next-page"' in listing.text

    # the per-minute chart counts every job that ended, however many there are: from counters
    # the transition keeps, not from a sample of records
    overview = gateway.get("/dashboard/api/overview").json
    assert sum(overview["series"]["not_completed"]) == 3 and sum(overview["series"]["completed"]) == 0


@pytest.mark.parametrize("params,field", [({"status": "nope"}, "status"), ({"limit": "0"}, "limit"),
                                          ({"limit": "x"}, "limit"), ({"cursor": "abc"}, "cursor"),
                                          ({"cursor": "inf:job"}, "cursor")])
def test_jobs_list_rejects_bad_parameters(gateway, params, field):
    response = gateway.get("/dashboard/api/jobs", query_string=params)
    assert response.status_code == 400 and response.json["message"].startswith(field)
    assert gateway.get("/dashboard/jobs", query_string=params).status_code == 400


def test_trajectory_viewer_escapes_model_text_and_shows_tokens(gateway, store, qwen3_tokenizer):
    tokenizer = load_tokenizer(qwen3_tokenizer)
    messages = [{"role": "user", "content": f"Solve {XSS}"}]
    prompt = tokenizer.prompt_ids(messages)
    reply = tokenizer.encode(f"<think>hmm {XSS}</think>The answer is \\boxed{{1}}<|im_end|>")
    observation = tokenizer.observation_ids({"role": "user", "content": "again " + XSS})
    trajectory = {"prompt_ids": prompt, "response_ids": reply + observation,
                  "response_mask": [1] * len(reply) + [0] * len(observation),
                  "response_logprobs": [-0.01] * (len(reply) - 1) + [-3.0] + [0.0] * len(observation),
                  "messages": messages + [{"role": "assistant", "content": tokenizer.decode(reply)},
                                          {"role": "user", "content": "again " + XSS}],
                  "num_turns": 1, "tokenizer": qwen3_tokenizer,
                  "turns": [{"context_len": len(prompt), "output_start": 0, "output_len": len(reply),
                             "finish_reason": "stop"}]}
    finish_job(store, "xss-job", fields={"trajectory": trajectory, "eval": {"answer": XSS, "correct": False},
                                         "extra": {"artifacts": {"patch": PATCH}}})
    page = gateway.get("/dashboard/jobs/xss-job")
    assert page.status_code == 200
    assert XSS not in page.text and "<b>3</b>" not in page.text
    assert html.escape(XSS, quote=False) in page.text or "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page.text
    ids = [int(i) for i in re.findall(r'data-id="(\d+)"', page.text)]
    assert ids == prompt + reply + observation
    assert f"{len(prompt)} prompt tokens" in page.text and f"{len(reply)} model tokens" in page.text
    assert f"{len(observation)} observation tokens" in page.text
    assert 'class="diff-add">+y = &lt;b&gt;3&lt;/b&gt;</span>' in page.text
    assert 'id="fidelity"' in page.text
    assert gateway.get("/dashboard/jobs/no-such-job").status_code == 404


@pytest.fixture(scope="module")
def secured_app(cluster):
    app = make_app(cluster, api_token="user-secret", admin_token="admin-secret")
    yield app
    close_app(app)


def test_dashboard_sign_in_with_a_cookie(secured_app):
    with secured_app.test_client() as browser:
        page = browser.get("/dashboard/jobs?status=completed")
        assert page.status_code == 302
        assert page.headers["location"] == "/dashboard/login?next=/dashboard/jobs%3Fstatus%3Dcompleted"
        assert browser.get("/dashboard/api/overview").status_code == 401
        assert browser.get("/dashboard/static/dashboard.css").status_code == 200
        assert browser.get("/dashboard/login").status_code == 200
        wrong = browser.post("/dashboard/login", data={"token": "guess"})
        assert wrong.status_code == 401 and "not valid" in wrong.text
        signed = browser.post("/dashboard/login", data={"token": "user-secret", "next": "https://evil.example/"})
        assert signed.status_code == 302 and signed.headers["location"] == "/dashboard/"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "Path=/dashboard" in cookie and "SameSite=Strict" in cookie
        assert browser.get("/dashboard/api/overview").status_code == 200
        assert browser.get("/dashboard/jobs").status_code == 200
        # the cookie opens only the dashboard: the JSON API still needs the header
        cookie_only = {"Cookie": "prorl_dashboard_token=user-secret"}
        assert secured_app.test_client(use_cookies=False).get("/status", headers=cookie_only).status_code == 401
        assert browser.post("/dashboard/logout").status_code == 302
    bearer = secured_app.test_client().get("/dashboard/api/overview",
                                           headers={"Authorization": "Bearer admin-secret"})
    assert bearer.status_code == 200


def test_cancelled_job_page_says_where_it_was_cancelled(gateway, store):
    """A job cancelled during RUN says so (not "has not reached RUN"), and a reward that is not
    valid shows as a dash with its outcome, in the list as on the page."""
    for job_id, reached_run in (("cancel-in-run", True), ("cancel-in-init", False)):
        store.create(job_id, {"task": "math", "instance": {"problem": "p"}, "sampling_params": {},
                              "budget_s": 60, "attempt": 1})
        assert store.claim_stage(job_id, Stage.INIT).ok
        if reached_run:
            assert store.hand_over(job_id, Stage.INIT).ok
            assert store.claim_stage(job_id, Stage.RUN, {"run_node": "node-a"}).ok
        assert store.cancel(job_id).ok
    in_run = gateway.get("/dashboard/jobs/cancel-in-run").text
    assert "cancelled during RUN, before its first model turn ended" in in_run
    assert "has not reached RUN" not in in_run
    assert re.search(r'id="job-reward">–\s*<span class="muted">\(no valid reward: cancelled\)', in_run)
    assert "cancelled before RUN started" in gateway.get("/dashboard/jobs/cancel-in-init").text
    listing = gateway.get("/dashboard/jobs").text
    row = re.search(r'<tr data-job-id="cancel-in-run">(.*?)</tr>', listing, re.S).group(1)
    assert '<td class="num">–</td>' in row


def test_expected_think_drift_is_explained(gateway, store, qwen3_tokenizer):
    """Qwen3's template drops earlier turns' <think> blocks: the re-rendered text drifts there, and
    the viewer says that this is expected rather than warning."""
    tokenizer = load_tokenizer(qwen3_tokenizer)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    prompt = tokenizer.prompt_ids(messages)
    reply = tokenizer.encode("<think>two plus three</think>Let me check.<|im_end|>")
    observation = tokenizer.observation_ids({"role": "user", "content": "Sure?"})
    second = tokenizer.encode("<think>yes</think>\\boxed{5}<|im_end|>")
    trajectory = {"prompt_ids": prompt, "response_ids": reply + observation + second,
                  "response_mask": [1] * len(reply) + [0] * len(observation) + [1] * len(second),
                  "response_logprobs": [-0.1] * (len(reply) + len(observation) + len(second)),
                  "messages": messages + [{"role": "assistant", "content": tokenizer.decode(reply, False)
                                           .removesuffix("<|im_end|>")},
                                          {"role": "user", "content": "Sure?"},
                                          {"role": "assistant", "content": tokenizer.decode(second, False)
                                           .removesuffix("<|im_end|>")}],
                  "num_turns": 2, "tokenizer": qwen3_tokenizer}
    finish_job(store, "think-job", fields={"trajectory": trajectory})
    page = gateway.get("/dashboard/jobs/think-job").text
    assert re.search(r'class="fidelity expected" id="fidelity">Fidelity check: drift at id', page)
    assert "drops earlier turns&#39; &lt;think&gt; blocks" in page
    assert "training is not affected" in page
