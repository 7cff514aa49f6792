"""Task registry: built-ins, entry-point plug-ins, one instance per task, unknown tasks."""
from __future__ import annotations

import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import handlers
from handlers import AgentHandler, UnknownTask, get_handler, load_handlers, registered_tasks
from handlers.math import MathHandler
from handlers.noop import NoopHandler

PLUGIN_MODULE = "prorl_test_plugin_handlers"


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    handlers.clear_cache()
    yield
    sys.modules.pop(PLUGIN_MODULE, None)
    handlers.clear_cache()


def install_plugin(root: Path, entry_points: str) -> None:
    """A distribution as pip would leave it: a module and a .dist-info with entry points."""
    (root / f"{PLUGIN_MODULE}.py").write_text(textwrap.dedent("""
        from handlers.base import AgentHandler, EvalResult

        class EchoHandler(AgentHandler):
            name = "echo"

            async def run(self, job, llm):
                return {}

            async def eval(self, job):
                return EvalResult(reward=1.0)

        class NotAHandler:
            pass
    """))
    dist_info = root / "prorl_test_plugin-0.1.dist-info"
    dist_info.mkdir()
    metadata = "Metadata-Version: 2.1\nName: prorl-test-plugin\nVersion: 0.1\n"
    (dist_info / "METADATA").write_text(metadata)
    (dist_info / "entry_points.txt").write_text(f"[prorl.handlers]\n{entry_points}\n")


def test_builtins_are_registered() -> None:
    assert {"math", "noop"} <= set(registered_tasks())
    classes = load_handlers()
    assert classes["math"] is MathHandler and classes["noop"] is NoopHandler
    for task, cls in classes.items():
        assert issubclass(cls, AgentHandler)
        assert cls.name == task


def test_one_instance_per_task() -> None:
    assert isinstance(get_handler("math"), MathHandler)
    assert get_handler("math") is get_handler("math")
    assert get_handler("noop") is not get_handler("math")


def test_one_instance_even_under_concurrent_lookups() -> None:
    seen: list[AgentHandler] = []
    threads = [threading.Thread(target=lambda: seen.append(get_handler("math"))) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 16 and len({id(h) for h in seen}) == 1


def test_unknown_task_lists_registered_tasks() -> None:
    with pytest.raises(UnknownTask) as raised:
        get_handler("chess")
    error = raised.value
    assert isinstance(error, KeyError)
    # every installed task is listed, whatever other handlers this checkout ships
    tasks = registered_tasks()
    assert {"math", "noop"} <= set(tasks)
    assert str(error) == f"unknown task 'chess'; registered tasks: {', '.join(tasks)}"
    assert error.task == "chess" and error.registered == tasks


def test_entry_point_plugin_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = registered_tasks()
    install_plugin(tmp_path, f"echo = {PLUGIN_MODULE}:EchoHandler")
    monkeypatch.syspath_prepend(str(tmp_path))
    handlers.clear_cache()
    assert registered_tasks() == sorted([*shipped, "echo"])
    assert type(get_handler("echo")).__name__ == "EchoHandler"


def test_broken_plugins_are_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = registered_tasks()
    install_plugin(
        tmp_path,
        f"gone = {PLUGIN_MODULE}_missing:Handler\nwrong = {PLUGIN_MODULE}:NotAHandler",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    handlers.clear_cache()
    assert registered_tasks() == shipped
    with pytest.raises(UnknownTask, match="failed to load: .*ModuleNotFoundError"):
        get_handler("gone")
    with pytest.raises(UnknownTask, match="not an AgentHandler subclass"):
        get_handler("wrong")
