"""BubblewrapRuntime driven by an unprivileged user (``nobody``), as on an HPC login node.

The rest of the suite runs as root (as CI does), where the runtime starts bwrap as root and
drops the sandbox to uid 65534. Here the *caller* is unprivileged: bwrap makes the user
namespace itself (``--unshare-user --disable-userns``). The project's Python lives under
``/root`` (not readable by ``nobody``), so the caller runs Debian's ``/usr/bin/python3.11`` with
copies of the runtime's pure-Python dependencies, and the sandbox runs a stand-in tool server
(standard library only, same framing as the real one).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
NOBODY = 65534
DEPENDENCIES = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection")
pytestmark = pytest.mark.timeout(180)

STANDIN = textwrap.dedent("""\
    import asyncio, json, os, sys, time
    SOCKET = sys.argv[sys.argv.index("--socket") + 1]

    async def bash(command):
        proc = await asyncio.create_subprocess_shell(command, stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        return {"output": out.decode(errors="replace"), "exit_code": proc.returncode}

    async def handle(reader, writer):
        while True:
            try:
                size = int.from_bytes(await reader.readexactly(4), "big")
            except asyncio.IncompleteReadError:
                return
            request = json.loads(await reader.readexactly(size))
            result = ({"pong": True, "pid": os.getpid()} if request["tool"] == "ping"
                      else await bash(request["args"]["command"]))
            body = json.dumps({"id": request["id"], "ok": True, "result": result}).encode()
            writer.write(len(body).to_bytes(4, "big") + body)
            await writer.drain()

    async def main():
        server = await asyncio.start_unix_server(handle, SOCKET)
        print("READY", SOCKET, flush=True)
        await server.serve_forever()

    asyncio.run(main())
""")

CALLER = textwrap.dedent("""\
    import asyncio, json, os, sys
    from pathlib import Path
    from singularity.runtime import BubblewrapRuntime, Limits, SandboxSpec, procfs

    async def call(sock, tool, args):
        reader, writer = await asyncio.open_unix_connection(str(sock))
        body = json.dumps({"id": 1, "tool": tool, "args": args}).encode()
        writer.write(len(body).to_bytes(4, "big") + body)
        size = int.from_bytes(await reader.readexactly(4), "big")
        response = json.loads(await reader.readexactly(size))
        writer.close()
        return response["result"]

    async def main():
        workspace = Path(sys.argv[1])
        runtime = BubblewrapRuntime(server_argv=["{python}", "/workspace/standin.py", "--socket", "{socket}"])
        report = {"available": runtime.available().reason, "privileged": runtime.privileged}
        sandbox = await runtime.start(SandboxSpec(image="dev", workspace=workspace,
                                                  limits=Limits(max_processes=24)))
        report["ping"] = (await call(sandbox.socket_path, "ping", {}))["pong"]
        probe = ("id -u; cat /proc/self/uid_map | wc -l; ls /proc | grep -c '^[0-9]'; "
                 "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
                 "touch /usr/x 2>/dev/null || echo RO; echo hi > /workspace/out.txt; "
                 "unshare -U true 2>/dev/null || echo NO-NESTED-USERNS; "
                 "for i in $(seq 40); do sleep 5 >/dev/null 2>&1 & done 2>/dev/null; true")
        report["probe"] = (await call(sandbox.socket_path, "bash", {"command": probe}))["output"].split()
        report["members"] = len(procfs.members(sandbox.root, sandbox.pidns))
        seen = procfs.members(sandbox.root, sandbox.pidns)
        await sandbox.stop(grace_s=1.0)
        report["left"] = [i.pid for i in procfs.members(sandbox.root, sandbox.pidns, zombies=True)]
        report["seen_alive"] = [i.pid for i in seen if (s := procfs.read_stat(i.pid)) and s.start_time == i.start_time]
        print(json.dumps(report))

    asyncio.run(main())
""")


def _copy_dependencies(site: Path) -> None:
    for name in DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            pytest.skip(f"{name} is not installed")
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, site / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, site / origin.name)
    package = site / "singularity"
    package.mkdir()
    shutil.copy2(ROOT / "singularity" / "__init__.py", package / "__init__.py")
    shutil.copytree(ROOT / "singularity" / "runtime", package / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))


@pytest.fixture
def nobody_home():
    if os.geteuid() != 0:
        pytest.skip("already unprivileged: the contract suite itself runs bubblewrap unprivileged")
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} (Debian's python3 of the same minor version) is not installed")
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            "bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"this machine does not let an unprivileged user create namespaces: {probe.stderr.strip()}")
    home = Path(tempfile.mkdtemp(prefix="prorl-nobody-", dir="/tmp"))
    home.chmod(0o755)
    (home / "site").mkdir()
    _copy_dependencies(home / "site")
    workspace = home / "ws"
    workspace.mkdir()
    (workspace / "standin.py").write_text(STANDIN)
    (home / "caller.py").write_text(CALLER)
    for path in [workspace, *workspace.iterdir()]:
        os.chown(path, NOBODY, NOBODY)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_unprivileged_caller_runs_the_runtime(nobody_home):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(nobody_home / "site"), "LANG": "C.UTF-8"}
    done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           str(PYTHON), str(nobody_home / "caller.py"), str(nobody_home / "ws")],
                          capture_output=True, text=True, timeout=120, env=env, cwd="/tmp")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["privileged"] is False and "unprivileged" in report["available"]
    assert report["ping"] is True
    assert len(report["probe"]) == 6, report
    uid, map_lines, nprocs, iface, readonly, nested = report["probe"]
    assert uid == str(NOBODY) and map_lines == "1"  # itself, in its own user namespace
    assert int(nprocs) <= 10 and iface == "lo" and readonly == "RO" and nested == "NO-NESTED-USERNS"
    assert 10 < report["members"] <= 24 + 1, report  # RLIMIT_NPROC held the 40 sleeps back
    assert (nobody_home / "ws" / "out.txt").read_text() == "hi\n"
    assert report["left"] == [] and report["seen_alive"] == []
