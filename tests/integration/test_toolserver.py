"""The tool server as a real subprocess on a Unix socket: bash, IPython, editor, search, the
protocol, the client's errors and a clean exit. No timing asserts: only generous ceilings."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from singularity.toolserver.client import ToolClient
from singularity.toolserver.errors import ToolError
from singularity.toolserver.launch import LocalToolServer
from singularity.toolserver.procs import is_running

CORPUS = [
    {"id": "d1", "title": "Bubble sort", "text": "Bubble sort repeatedly swaps adjacent elements."},
    {
        "id": "d2",
        "title": "Binary search",
        "text": "Binary search halves a sorted array each step.",
    },
    {
        "id": "d3",
        "title": "Dijkstra",
        "text": "Shortest paths in a graph with non-negative weights.",
    },
    {
        "id": "d4",
        "title": "Hash tables",
        "text": "Hash tables map keys to buckets for fast lookup.",
    },
]


def run(coro):
    return asyncio.run(coro)


async def call(server: LocalToolServer, method: str, *args, **kwargs):
    async with ToolClient(server.socket) as client:
        return await getattr(client, method)(*args, **kwargs)


def start(tmp: Path, **options) -> LocalToolServer:
    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    log = open(tmp / "toolserver.log", "ab")
    return LocalToolServer.start(
        tmp / "run" / "tools.sock", workspace, stderr=log, log_level="INFO", **options
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toolserver")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    handle = start(tmp, search_corpus=corpus, max_output=4096)
    yield handle
    assert handle.stop() == 0


@pytest.fixture
def workspace(server) -> Path:
    return Path(run(call(server, "bash", "pwd")).output.strip())


# -- bash --------------------------------------------------------------------------------------


def test_bash_state_persists_across_commands(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            await tools.bash("mkdir -p state_dir && cd state_dir && export PERSIST=kept-value")
            return await tools.bash("pwd; echo $PERSIST; cd ..")

    result = run(scenario())
    assert result.output.splitlines()[0].endswith("/state_dir")
    assert result.output.splitlines()[1] == "kept-value"
    assert result.exit_code == 0 and not result.timed_out


def test_bash_exit_codes_and_clean_output(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            return [
                await tools.bash(c)
                for c in ("true", "false", "sh -c 'exit 7'", "printf abc", "echo one; echo two")
            ]

    results = run(scenario())
    assert [r.exit_code for r in results] == [0, 1, 7, 0, 0]
    assert results[3].output == "abc"  # no echo of the command, no sentinel, no prompt
    assert results[4].output == "one\ntwo\n"


def test_bash_multiline_heredoc_and_syntax_error(server):
    script = "cat <<'EOF'\nline $1\nsecond\nEOF\nif true; then\n  echo inside\nfi"
    result = run(call(server, "bash", script))
    assert result.output == "line $1\nsecond\ninside\n"
    broken = run(call(server, "bash", "echo 'unbalanced", timeout_s=20))
    assert broken.exit_code == 2 and not broken.timed_out
    assert "unexpected EOF" in broken.output and "bash-command.sh" not in broken.output


def test_bash_quoting_unicode_and_long_commands(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            quoted = await tools.bash(
                """printf '%s|' 'héllo ✓' "it's" 'back\\slash' '!bang' $'tab\\there'"""
            )
            long = await tools.bash("X=" + "y" * 3500 + "; echo ${#X}")  # past the typed-line limit
            return quoted, long

    quoted, long = run(scenario())
    assert quoted.output == "héllo ✓|it's|back\\slash|!bang|tab\there|"
    assert long.output == "3500\n" and long.exit_code == 0


def test_bash_timeout_interrupts_and_keeps_the_session(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            await tools.bash("export BEFORE_TIMEOUT=yes; mkdir -p t_dir; cd t_dir")
            slow = await tools.bash("echo started; sleep 60", timeout_s=0.5)
            after = await tools.bash("echo $BEFORE_TIMEOUT; basename $(pwd); cd ..")
            return slow, after

    slow, after = run(scenario())
    assert slow.timed_out and slow.exit_code == 130 and not slow.shell_restarted
    assert "started" in slow.output
    assert after.output.split() == ["yes", "t_dir"] and not after.timed_out


@pytest.mark.parametrize("command", ["read answer", f"{sys.executable} -c 'input()'", "cat"])
def test_bash_interactive_command_times_out_and_shell_still_works(server, command):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            waiting = await tools.bash(command, timeout_s=0.5)
            return waiting, await tools.bash("echo still-alive")

    waiting, after = run(scenario())
    assert waiting.timed_out and not waiting.shell_restarted
    assert after.output == "still-alive\n" and after.exit_code == 0


def test_bash_command_ignoring_ctrl_c_gets_a_new_shell(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            stuck = await tools.bash("trap '' INT; sleep 60", timeout_s=0.5)
            return stuck, await tools.bash("echo fresh")

    stuck, after = run(scenario())
    assert stuck.timed_out and stuck.shell_restarted and stuck.exit_code is None
    assert after.output == "fresh\n"


def test_bash_huge_output_is_truncated_with_a_note(server):
    result = run(call(server, "bash", "seq 1 200000", timeout_s=60))
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n") and result.output.endswith("199999\n200000\n")
    assert "bytes of output dropped (limit 4096 bytes)" in result.output
    assert len(result.output) < 4096 + 200


def test_bash_background_process_returns_at_once(server, workspace):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            started = time.monotonic()
            result = await tools.bash("sleep 100 & echo $! > bg.pid", timeout_s=30)
            return result, time.monotonic() - started

    result, elapsed = run(scenario())
    assert not result.timed_out and result.exit_code == 0 and elapsed < 20
    pid = int((workspace / "bg.pid").read_text())
    assert is_running(pid)
    os.kill(pid, signal.SIGKILL)


def test_bash_exit_starts_a_new_shell(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            return await tools.bash("exit 3"), await tools.bash("echo back")

    ended, after = run(scenario())
    assert ended.exit_code == 3 and ended.shell_restarted
    assert after.output == "back\n" and after.shell_restarted


# -- ipython -----------------------------------------------------------------------------------


def test_ipython_state_output_result_and_errors(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            first = await tools.ipython(
                "import sys\nx = 41\nprint('out')\nprint('err', file=sys.stderr)\nx + 1",
                timeout_s=60,
            )
            second = await tools.ipython("x * 2")
            failed = await tools.ipython("def f():\n    return 1 / 0\nf()")
            asked = await tools.ipython("input('name? ')")
            return first, second, failed, asked

    first, second, failed, asked = run(scenario())
    assert (first.stdout, first.stderr, first.result, first.error) == ("out\n", "err\n", "42", None)
    assert second.result == "82"
    assert failed.error == "ZeroDivisionError: division by zero"
    assert "Traceback" in failed.traceback and "1 / 0" in failed.traceback
    assert "\x1b[" not in failed.traceback
    assert asked.error.startswith("StdinNotImplementedError")


@pytest.mark.parametrize(
    "cell",
    [
        "while True: pass",
        "import time; time.sleep(100)",
        "import asyncio; await asyncio.sleep(100)",
    ],
)
def test_ipython_timeout_interrupts_and_keeps_the_kernel(server, cell):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            await tools.ipython("kept = 'state'", timeout_s=60)
            stuck = await tools.ipython(cell, timeout_s=0.5)
            return stuck, await tools.ipython("kept")

    stuck, after = run(scenario())
    assert stuck.timed_out and not stuck.kernel_busy
    assert stuck.error.startswith("KeyboardInterrupt")
    assert "_on_sigint" not in (stuck.traceback or "")
    assert after.result == "'state'" and not after.timed_out


# -- editor ------------------------------------------------------------------------------------


def test_editor_create_view_replace_insert_undo(server, workspace):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            await tools.editor("create", "pkg/mod.py", file_text="a = 1\nb = 2\nc = 3")
            replaced = await tools.editor(
                "str_replace", "pkg/mod.py", old_str="b = 2", new_str="b = 20"
            )
            inserted = await tools.editor("insert", "pkg/mod.py", insert_line=1, new_str="# note")
            ranged = await tools.editor("view", "pkg/mod.py", view_range=(2, 3))
            listing = await tools.editor("view", ".")
            await tools.editor("undo", "pkg/mod.py")
            after_undo = (workspace / "pkg/mod.py").read_text()
            await tools.editor("undo", "pkg/mod.py")
            await tools.editor("undo", "pkg/mod.py")  # undoes the create: the file goes
            return replaced, inserted, ranged, listing, after_undo

    replaced, inserted, ranged, listing, after_undo = run(scenario())
    assert "b = 20" in replaced.output and replaced.path == "pkg/mod.py"
    assert "# note" in inserted.output
    assert ranged.output == "     2\t# note\n     3\tb = 20"
    assert "pkg/" in listing.output and "pkg/mod.py" in listing.output
    assert after_undo == "a = 1\nb = 20\nc = 3"
    assert not (workspace / "pkg/mod.py").exists()


@pytest.mark.parametrize(
    "args, code, words",
    [
        (("view", "missing.txt"), "file_not_found", "does not exist"),
        (
            ("str_replace", "dup.txt", {"old_str": "x", "new_str": "y"}),
            "multiple_matches",
            "3 times",
        ),
        (
            ("str_replace", "dup.txt", {"old_str": "absent", "new_str": "y"}),
            "no_match",
            "does not occur",
        ),
        (("create", "dup.txt", {"file_text": "new"}), "file_exists", "already exists"),
        (("view", "dup.txt", {"view_range": (5, 9)}), "invalid_range", "outside"),
        (
            ("insert", "dup.txt", {"insert_line": 99, "new_str": "z"}),
            "invalid_range",
            "past the end",
        ),
        (("undo", "never-edited.txt"), "nothing_to_undo", "no edit"),
        (("view", "../outside.txt"), "path_outside_workspace", "outside the workspace"),
        (("view", "/etc/passwd"), "path_outside_workspace", "outside the workspace"),
        (
            ("create", "sub/../../escape.txt", {"file_text": "x"}),
            "path_outside_workspace",
            "outside",
        ),
        (("view", "link_out/passwd"), "path_outside_workspace", "outside the workspace"),
        (("create", "link_out/new", {"file_text": "x"}), "path_outside_workspace", "outside"),
    ],
)
def test_editor_errors(server, workspace, args, code, words):
    (workspace / "dup.txt").write_text("x\nx\nx")
    if not (workspace / "link_out").is_symlink():
        (workspace / "link_out").symlink_to("/etc")
    command, path, *rest = args
    with pytest.raises(ToolError) as caught:
        run(call(server, "editor", command, path, **(rest[0] if rest else {})))
    assert caught.value.code == code and words in caught.value.message


def test_editor_accepts_absolute_paths_inside_the_workspace(server, workspace):
    result = run(
        call(server, "editor", "create", str(workspace / "abs.txt"), file_text="ok", overwrite=True)
    )
    assert result.path == "abs.txt" and (workspace / "abs.txt").read_text() == "ok"


# -- search ------------------------------------------------------------------------------------


def test_search_bm25_over_the_local_corpus(server):
    hits = run(call(server, "search", "sorted array binary", k=2)).hits
    assert hits[0].id == "d2" and hits[0].title == "Binary search"
    assert len(hits) <= 2 and all(h.score > 0 for h in hits)
    assert run(call(server, "search", "zebra unicorn")).hits == []


def test_warm_starts_the_shell_kernel_and_index_without_running_a_cell(tmp_path):
    """A warm pool's sandbox: ``warm`` starts what the job will use; the job's first cell is
    still the kernel's first (``In`` holds only it), and its first search finds the index built."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    handle = start(tmp_path, search_corpus=corpus)
    try:
        cold = run(call(handle, "warm"))
        assert (cold.shell, cold.ipython, cold.search) == (True, False, False)
        warmed = run(call(handle, "warm", ipython=True, search=True))
        assert (warmed.shell, warmed.ipython, warmed.search) == (True, True, True)
        again = run(call(handle, "warm", ipython=True, search=True))
        assert again.seconds < warmed.seconds  # started once
        first = run(call(handle, "ipython", "len(In), 6 * 7"))
        assert first.result == "(2, 42)", first
        assert run(call(handle, "search", "sorted array binary", k=1)).hits[0].id == "d2"
    finally:
        assert handle.stop() == 0
