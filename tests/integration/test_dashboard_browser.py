"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python package) against the real gateway, workers, Redis and a scripted LLM server.

Screenshots go to ``$PRORL_TEST_ARTIFACTS`` (default: a pytest temporary directory);
``PRORL_UPDATE_SCREENSHOTS=1`` also copies the two docs/running.md shows to ``docs/screenshots/``.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
XSS = "<script>window.__xss=1</script>"
#: the screenshots docs/running.md shows
README_SHOTS = {"dashboard.png", "trajectory.png"}


def math(problem: str, answer: str, **extra) -> dict:
    return {"data_source": "math", "problem": problem, "answer": answer, **extra}


@pytest.fixture(scope="module")  # Playwright's sync API keeps an event loop running in this thread:
def browser():                    # it must stop before other modules call asyncio.run
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium chromium-driver)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is missing (pip install playwright; it drives the system chromium, "
                    "so `playwright install` is not needed)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    path = Path(os.environ.get("PRORL_TEST_ARTIFACTS") or tmp_path_factory.mktemp("screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert not errors, f"script errors on the page: {errors}"




def screenshot(page, artifacts: Path, name: str, **options) -> Path:
    path = artifacts / name
    page.screenshot(path=str(path), **options)
    if os.environ.get("PRORL_UPDATE_SCREENSHOTS") == "1" and name in README_SHOTS:
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS / name)
    return path


def expect(locator):
    # Playwright's wait_for_function evaluates a string, which the pages' CSP forbids; its
    # expect() polls without eval
    from playwright.sync_api import expect as playwright_expect
    return playwright_expect(locator)


def text(page, selector: str) -> str:
    return page.locator(selector).text_content().strip()


def test_dashboard_shows_status_numbers_and_updates_without_reload(gateway, backend, page, artifacts):
    gateway.cluster.wait_for_workers()  # the fixture flushed Redis: heartbeats come back within 5 s
    page.goto(gateway.cluster.gateway_url + "/dashboard")
    expect(page.locator("#state")).to_have_text("started")
    status = gateway.get("/status").json()
    for stage, numbers in status["stages"].items():
        assert text(page, f"#stage-{stage}-queued") == str(numbers["queued"])
        assert text(page, f"#stage-{stage}-active") == str(numbers["active"])
    assert text(page, "#job-count-completed") == str(status["jobs"]["completed"]) == "0"
    assert text(page, "#worker-count") == str(len(status["workers"]))
    assert backend.address() in text(page, "#backends")
    page.evaluate("window.__no_reload = 'still here'")

    jobs = [gateway.submit(math("What is 2 + 3?", "5")) for _ in range(3)]
    jobs += [gateway.submit(math("What is 7 \\times 6?", "42")), gateway.submit(math("MULTI: 10 - 4?", "6"))]
    failing = gateway.submit({"data_source": "fault", "fail": "run"}, max_attempts=1)
    results = [gateway.result(job_id) for job_id in jobs]
    completed = sum(r["status"] == "completed" for r in results)
    assert completed == 5 and gateway.result(failing)["status"] == "failed"

    expect(page.locator("#job-count-completed")).to_have_text(str(completed), timeout=20_000)
    assert page.evaluate("window.__no_reload") == "still here"  # refreshed in place, not reloaded
    assert int(page.locator("#updated").get_attribute("data-refreshes")) > 0
    status = gateway.get("/status").json()
    assert text(page, "#job-count-completed") == str(status["jobs"]["completed"])
    assert text(page, "#ended-completed") == str(status["jobs"]["completed"])
    expect(page.locator("#ended-failed")).to_have_text(str(status["jobs"]["failed"]))
    assert status["jobs"]["failed"] == 1
    # the failed one is the environment's doing (retried, then ended): counted by its outcome
    assert (status["outcomes"]["ok"], status["outcomes"]["env_error"]) == (5, 1)
    assert text(page, "#outcome-count-ok") == "5" and text(page, "#outcome-count-env_error") == "1"
    assigned = {b["address"]: b["assigned"] for b in status["backends"]}
    expect(page.locator("#chart-completed rect.bar")).not_to_have_count(0)
    bars = page.eval_on_selector_all("#chart-completed rect.bar:not(.bad)",
                                     "els => els.map(e => +e.dataset.value)")
    assert sum(bars) == completed
    backend_rows = page.eval_on_selector_all(
        "#backends tr", "rows => rows.map(r => [...r.children].map(c => c.textContent))")
    assert [backend.address(), "vllm", str(assigned[backend.address()]), "0"] in backend_rows
    for stage in ("init", "run", "eval"):  # workers flush their histograms every 2 s
        expect(page.locator(f"#stage-{stage}-durations")).to_have_text(re.compile("^p50"), timeout=20_000)
    screenshot(page, artifacts, "dashboard.png", full_page=True)

    page.goto(gateway.cluster.gateway_url + "/dashboard/jobs?status=completed")
    listed = page.eval_on_selector_all("#jobs-table tbody tr", "rows => rows.map(r => r.dataset.jobId)")
    assert sorted(listed) == sorted(jobs)
    page.click(f"a[href='/dashboard/jobs/{jobs[-1]}']")
    page.wait_for_selector("#job-id")
    assert text(page, "#job-id") == jobs[-1]
    screenshot(page, artifacts, "jobs.png")


def assert_viewer_matches(page, result: dict) -> None:
    trajectory = result["trajectory"]
    roles = page.eval_on_selector_all("#conversation article.msg", "els => els.map(e => e.dataset.role)")
    assert roles == [m["role"] for m in result["messages"]]
    assert text(page, "#num-turns") == str(trajectory["num_turns"])
    shown = page.eval_on_selector_all("#conversation article.msg", "els => els.map(e => e.textContent)")
    for message, article in zip(result["messages"], shown):
        for line in message["content"].replace("<think>", "").replace("</think>", "").splitlines():
            if line.strip() and not line.strip().startswith(("<tool_call>", "</tool_call>", "{")):
                assert line.strip() in article, (line, article)
    ids = page.eval_on_selector_all("#token-view .tok", "els => els.map(e => +e.dataset.id)")
    assert ids == trajectory["prompt_ids"] + trajectory["response_ids"]
    kinds = page.eval_on_selector_all("#token-view .tok", "els => els.map(e => e.classList[1])")
    expected = ["tok-prompt"] * len(trajectory["prompt_ids"]) + \
        ["tok-model" if m == 1 else "tok-obs" for m in trajectory["response_mask"]]
    assert kinds == expected
    logprobs = page.eval_on_selector_all("#token-view .tok-model", "els => els.map(e => +e.dataset.logprob)")
    model_logprobs = [lp for lp, m in zip(trajectory["response_logprobs"], trajectory["response_mask"]) if m == 1]
    assert logprobs == pytest.approx(model_logprobs, abs=1e-4)
    assert "decoded with" in text(page, "#tokenizer-note")
    assert text(page, "#fidelity").startswith("Fidelity check:")


def test_trajectory_viewer_shows_every_turn_and_the_exact_token_ids(gateway, backend, page, artifacts):
    result = gateway.process(math("MULTI: what is 10 - 4?", "6", max_iterations=4))
    assert result["trajectory"]["num_turns"] == 3
    page.goto(gateway.cluster.gateway_url + f"/dashboard/jobs/{result['job_id']}")
    assert_viewer_matches(page, result)
    assert page.locator("#conversation .tokens-count").count() >= 4
    page.hover("#token-view .tok-model >> nth=0")
    assert "logprob" in text(page, "#token-info")
    page.click("#toggle-ids")
    assert "ids" in page.get_attribute("#token-view", "class")


def test_trajectory_viewer_shows_tool_calls_and_observations(gateway, backend, page, artifacts):
    result = gateway.process(math("PYTOOL: what is 6 times 7?", "42", tools=["python"], max_iterations=3))
    assert result["reward"] == 1.0 and [m["role"] for m in result["messages"]].count("tool") == 1
    page.goto(gateway.cluster.gateway_url + f"/dashboard/jobs/{result['job_id']}")
    assert_viewer_matches(page, result)
    assert text(page, ".tool-call .tool-name") == "\u2699 python"
    assert "x = 6 * 7" in text(page, ".tool-call pre.code")
    assert "42" in text(page, "article.role-tool .msg-text")
    assert [call["name"] for call in result["tool_log"]] == ["python"]  # timed by the agent loop
    assert "python" in text(page, "#tool-log")
    page.locator("#token-view .tok-model").first.scroll_into_view_if_needed()
    screenshot(page, artifacts, "trajectory.png", full_page=True)


def test_script_in_a_trajectory_renders_as_text(gateway, backend, page, artifacts):
    result = gateway.process(math(f"What is 2 + 3? {XSS}", "5"))
    assert result["status"] == "completed" and XSS in result["messages"][-2]["content"]
    for path in (f"/dashboard/jobs/{result['job_id']}", "/dashboard/jobs", "/dashboard"):
        page.goto(gateway.cluster.gateway_url + path)
        page.wait_for_load_state("load")
        assert page.evaluate("typeof window.__xss") == "undefined", path
    page.goto(gateway.cluster.gateway_url + f"/dashboard/jobs/{result['job_id']}")
    user_text = page.locator("#conversation article.role-user .msg-text").last
    assert XSS in user_text.text_content()
    assert user_text.is_visible()
    assert page.locator("#conversation script").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    screenshot(page, artifacts, "xss.png")



#: a node name as Slurm or a cloud names one: the longest cell of the Nodes card
LONG_NODE = "gpu-a100-node-017.cluster.example.org"
#: each card of the dashboard's grid: its title, box, and how far its content reaches
CARD_BOXES = """() => [...document.querySelectorAll('.grid > .card')].map(card => {
  const box = card.getBoundingClientRect();
  return {title: card.querySelector('h2').firstChild.textContent.trim(), left: box.left, right: box.right,
          top: box.top, bottom: box.bottom, scroll: card.scrollWidth, client: card.clientWidth};
})"""


@pytest.mark.parametrize("width", [1280, 1400])
def test_every_card_fits_its_column_with_a_long_node_name(gateway, backend, browser, artifacts, width):
    """Issue 37: the Nodes card overflowed its column at 1,280 and 1,400 px wide windows."""
    import time

    import redis

    from prorl_celery.state import keys
    gateway.cluster.wait_for_workers()
    # a node seen once and since gone: the service lists it as any other, by its full name
    redis.Redis.from_url(gateway.cluster.state_url).zadd(keys.NODES, {LONG_NODE: time.time()})
    context = browser.new_context(viewport={"width": width, "height": 1000})
    try:
        tab = context.new_page()
        tab.goto(gateway.cluster.gateway_url + "/dashboard")
        expect(tab.locator("#nodes tr", has_text=LONG_NODE)).to_have_count(1)
        cards = tab.evaluate(CARD_BOXES)
        screenshot(tab, artifacts, f"dashboard-{width}.png", full_page=True)
    finally:
        context.close()
    assert "Nodes" in [card["title"] for card in cards]
    for card in cards:  # nothing of a card's content reaches past its border
        assert card["scroll"] <= card["client"], (width, card)
    for one in cards:  # and no card reaches into its neighbour's column
        for other in cards:
            overlap = min(one["right"], other["right"]) - max(one["left"], other["left"]) > 0 and \
                min(one["bottom"], other["bottom"]) - max(one["top"], other["top"]) > 0
            assert one is other or not overlap, (width, one, other)
