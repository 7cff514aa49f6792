"""Runtime pieces without a sandbox: specs, command lines (bubblewrap and the exact Apptainer
ones), image layouts, the loopback allocator under 500 concurrent allocations from several
processes, the ledger and the reaper on plain processes, and /proc-based termination."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from singularity.runtime import (
    AddressExhausted,
    ApptainerRuntime,
    BubblewrapRuntime,
    FileAddressAllocator,
    FileSandboxLedger,
    InvalidSpec,
    Limits,
    MemoryAddressAllocator,
    ProcessRef,
    RuntimeUnavailable,
    SandboxRecord,
    SandboxSpec,
    make_runtime,
    procfs,
    reap,
)
from singularity.runtime.apptainer import instance_exec_command, instance_start_command, instance_stop_command
from singularity.runtime.base import limit_prefix, sandbox_env
from singularity.runtime.layout import IMAGE_METADATA, Mount, dev_layout, rootfs_layout
from singularity.runtime.stopping import due, retry_delay

pytestmark = pytest.mark.timeout(120)


# -- specs ------------------------------------------------------------------------------------------

def test_spec_accepts_tuples_and_rejects_unknown_fields(tmp_path):
    spec = SandboxSpec(image="dev", workspace=tmp_path, binds=[("/data", "/data"), ("/x", "/y/z", False)])
    assert [(str(b.source), b.target, b.read_only) for b in spec.binds] == [
        ("/data", "/data", True), ("/x", "/y/z", False)]
    with pytest.raises(ValidationError, match="extra"):
        SandboxSpec(image="dev", workspace=tmp_path, netwrk=True)


@pytest.mark.parametrize("target", ["relative", "/a/../etc", "/", "/proc", "/workspace/sub", "/run/toolserver"])
def test_spec_rejects_bad_bind_targets(tmp_path, target):
    with pytest.raises(ValidationError):
        SandboxSpec(image="dev", workspace=tmp_path, binds=[("/data", target)])


def test_spec_rejects_bad_env_and_address(tmp_path):
    with pytest.raises(ValidationError):
        SandboxSpec(image="dev", workspace=tmp_path, env={"BAD NAME": "x"})
    with pytest.raises(ValidationError, match="loopback"):
        SandboxSpec(image="dev", workspace=tmp_path, address="10.0.0.1")
    with pytest.raises(ValidationError):
        Limits(memory_bytes=0)


def test_environment_and_limit_prefix(tmp_path):
    spec = SandboxSpec(image="dev", workspace=tmp_path, env={"A": "1", "HOME": "/workspace"},
                       address="127.100.0.7")
    assert sandbox_env(spec, extra={"PYTHONPATH": "/opt/prorl"}) == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/workspace",
        "LANG": "C.UTF-8", "PRORL_SANDBOX_ADDRESS": "127.100.0.7", "PYTHONPATH": "/opt/prorl", "A": "1"}
    assert limit_prefix(Limits()) == []
    assert limit_prefix(Limits(max_processes=64, memory_bytes=1 << 30, cpu_seconds=5)) == [
        "prlimit", "--nproc=64:64", f"--as={1 << 30}:{1 << 30}", "--cpu=5:5", "--"]


# -- bubblewrap command line ---------------------------------------------------------------------------

def _pairs(args: list[str], flag: str, width: int = 2) -> list[tuple[str, ...]]:
    return [tuple(args[i + 1:i + 1 + width]) for i, arg in enumerate(args) if arg == flag]


def test_bubblewrap_argv(tmp_path):
    runtime = BubblewrapRuntime(state_dir=tmp_path / "state")
    spec = SandboxSpec(image="dev", workspace=tmp_path / "ws", binds=[(tmp_path, "/data", False)],
                       env={"K": "v"}, limits=Limits(max_processes=32))
    args = runtime.argv(spec, dev_layout(), tmp_path / "sbx", info_fd=7, block_fd=8 if runtime.privileged else None)
    command = args[args.index("--") + 1:]
    assert args[:2] == ["--unshare-all", "--unshare-user"] and "--share-net" not in args
    for flag in ("--die-with-parent", "--new-session", "--clearenv"):
        assert flag in args
    assert _pairs(args, "--info-fd", 1) == [("7",)]
    assert ("/workspace",) in _pairs(args, "--chdir", 1) and args[args.index("--") - 1] != "/"
    assert (str(tmp_path / "ws"), "/workspace") in _pairs(args, "--bind")
    assert (str(tmp_path / "sbx" / "sock"), "/run/toolserver") in _pairs(args, "--bind")
    assert (str(tmp_path), "/data") in _pairs(args, "--bind")
    assert ("/usr", "/usr") in _pairs(args, "--ro-bind")
    assert _pairs(args, "--remount-ro", 1) == [("/",)]
    assert ("K", "v") in _pairs(args, "--setenv") and ("HOME", "/tmp") in _pairs(args, "--setenv")
    assert ("1777", "--size") in _pairs(args, "--perms")
    # the dev image knows its site-packages: python -S, and they follow the source on PYTHONPATH
    assert command[-8:] == [sys.executable, "-S", "-m", "singularity.toolserver", "--socket",
                            "/run/toolserver/tool.sock", "--workspace", "/workspace"]
    pythonpath = dict(_pairs(args, "--setenv"))["PYTHONPATH"].split(":")
    assert pythonpath[0] == "/opt/prorl" and set(dev_layout().site_dirs) <= set(pythonpath)
    assert dev_layout().site_dirs and all(os.path.isdir(d) for d in dev_layout().site_dirs)
    assert "--nproc=32:32" in command
    if runtime.privileged:  # root caller: the sandbox drops to nobody inside
        assert _pairs(args, "--userns-block-fd", 1) == [("8",)]
        assert command[:2] == ["setpriv", "--reuid=65534"] and "--disable-userns" not in args
    else:
        assert "--disable-userns" in args and command[0] == "prlimit"
    networked = runtime.argv(spec.model_copy(update={"network": True}), dev_layout(True), tmp_path,
                             info_fd=7)
    assert "--share-net" in networked and ("/etc/resolv.conf", "/etc/resolv.conf") in _pairs(networked, "--ro-bind")


def test_bubblewrap_binds_an_interpreter_under_tmp_after_its_fresh_tmp(tmp_path):
    """A virtualenv under /tmp stays visible: bound after the sandbox's own /tmp, not under it."""
    layout = dev_layout()
    venv = Mount("ro-bind", "/tmp/venv-x", "/tmp/venv-x")
    args = BubblewrapRuntime().argv(SandboxSpec(image="dev", workspace=tmp_path / "ws"),
                                    replace(layout, mounts=(*layout.mounts, venv)), tmp_path, info_fd=7)
    tmpfs = max(i for i, arg in enumerate(args) if arg == "--tmpfs" and args[i + 1] == "/tmp")
    bound = [i for i, arg in enumerate(args) if arg == "--ro-bind" and args[i + 2] == "/tmp/venv-x"]
    usr = [i for i, arg in enumerate(args) if arg == "--ro-bind" and args[i + 2] == "/usr"]
    assert len(bound) == 1 and bound[0] > tmpfs and usr[0] < tmpfs


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root caller runs sandboxes as another uid")
def test_bubblewrap_says_at_start_that_the_sandbox_uid_cannot_reach_the_interpreter(tmp_path):
    """An interpreter the sandbox uid cannot execute (a 0700 directory on its way) is named at
    start, instead of a bare ``setpriv: failed to execute`` in the sandbox's log."""
    locked = tmp_path / "py" / "locked" / "bin"
    locked.mkdir(parents=True)
    os.symlink(sys.executable, locked / "python")
    (tmp_path / "py").chmod(0o755)
    (tmp_path / "py" / "locked").chmod(0o700)
    layout = dev_layout()
    layout = replace(layout, mounts=(*layout.mounts, Mount("ro-bind", str(tmp_path / "py"), "/opt/py")),
                     python="/opt/py/locked/bin/python")
    runtime = BubblewrapRuntime(bind_source=False)
    spec = SandboxSpec(image="dev", workspace=tmp_path / "ws")
    with pytest.raises(InvalidSpec, match=r"uid 65534, which cannot execute .*locked is mode 700"):
        runtime._check(spec, layout)
    (tmp_path / "py" / "locked").chmod(0o755)
    runtime._check(spec, layout)  # reachable now


def test_bubblewrap_refuses_other_uids_when_unprivileged():
    if os.geteuid() == 0:
        assert BubblewrapRuntime(sandbox_uid=0).privileged is False
        assert BubblewrapRuntime().sandbox_uid == 65534
    else:
        with pytest.raises(ValueError):
            BubblewrapRuntime(sandbox_uid=os.geteuid() + 1)


def test_layout_bind_targets(tmp_path):
    layout = dev_layout()
    layout.check_target("/data/x")  # a new directory on the tmpfs root
    layout.check_target("/usr/share")  # exists in the image
    with pytest.raises(InvalidSpec, match="does not exist"):
        layout.check_target("/usr/no-such-dir-here")
    if os.path.islink("/bin"):
        with pytest.raises(InvalidSpec, match="symlink"):
            layout.check_target("/bin/tool")


def test_rootfs_layout(tmp_path):
    root = tmp_path / "rootfs"
    for name in ("usr/bin", "etc", "proc", "dev", "tmp", "workspace"):
        (root / name).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / IMAGE_METADATA).write_text('{"python": "/usr/bin/python3", "env": {"PATH": "/opt/venv/bin:/usr/bin"}}')
    layout = rootfs_layout(root)
    assert [(m.kind, m.target) for m in layout.mounts] == [
        ("symlink", "/bin"), ("ro-bind", "/etc"), ("ro-bind", "/usr")]
    assert layout.python == "/usr/bin/python3" and layout.env["PATH"].startswith("/opt/venv/bin")
    assert layout.has("/usr/bin") and not layout.has("/usr/bin/prlimit")
    with pytest.raises(InvalidSpec, match="not a directory"):
        rootfs_layout(tmp_path / "missing")


# -- apptainer: exact command lines --------------------------------------------------------------------

def test_apptainer_exec_command_line(tmp_path):
    runtime = ApptainerRuntime(binary="apptainer", fakeroot=True)
    spec = SandboxSpec(image="/images/swe.sif", workspace=Path("/scratch/ws"),
                       binds=[("/data/repo", "/repo"), ("/data/out", "/out", False)],
                       limits=Limits(max_processes=256, cpu_seconds=600))
    assert runtime.exec_command(spec, Path("/tmp/s/abc")) == [
        "apptainer", "exec", "--containall", "--no-mount", "home,cwd", "--pid", "--fakeroot",
        "--net", "--network", "none", "--pwd", "/workspace", "--env-file", "/tmp/s/abc/env",
        "--bind", "/scratch/ws:/workspace:rw", "--bind", "/tmp/s/abc/sock:/run/toolserver:rw",
        "--bind", "/data/repo:/repo:ro", "--bind", "/data/out:/out:rw",
        "/images/swe.sif", "prlimit", "--nproc=256:256", "--cpu=600:600", "--",
        "python3", "-m", "singularity.toolserver", "--socket", "/run/toolserver/tool.sock",
        "--workspace", "/workspace"]


def test_apptainer_network_cgroups_source_and_singularity_binary(tmp_path):
    runtime = ApptainerRuntime(binary="singularity", use_cgroups=True, bind_source=True)
    spec = SandboxSpec(image="/i.sif", workspace=Path("/ws"), network=True,
                       limits=Limits(memory_bytes=1 << 30, max_processes=64, cpu_seconds=9))
    argv = runtime.exec_command(spec, Path("/s"))
    assert argv[:6] == ["singularity", "exec", "--containall", "--no-mount", "home,cwd", "--pid"]
    assert "--net" not in argv and "--fakeroot" not in argv
    assert argv[argv.index("--memory") + 1] == str(1 << 30) and argv[argv.index("--pids-limit") + 1] == "64"
    assert argv[argv.index("/i.sif") + 1:argv.index("/i.sif") + 4] == ["prlimit", "--cpu=9:9", "--"]
    assert any(a.endswith(":/opt/prorl/singularity:ro") for a in argv)
    assert "PYTHONPATH=/opt/prorl\n" in runtime.env_file(spec)
    with pytest.raises(InvalidSpec, match=".sif"):
        runtime.exec_command(spec.model_copy(update={"image": "dev"}), Path("/s"))


def test_apptainer_env_file_and_instances():
    runtime = ApptainerRuntime(binary="apptainer")
    spec = SandboxSpec(image="/i.sif", workspace=Path("/ws"), env={"TOKEN": "a b,c'd"}, address="127.100.0.9")
    lines = runtime.env_file(spec).splitlines()
    assert "TOKEN='a b,c'\"'\"'d'" in lines and "PRORL_SANDBOX_ADDRESS=127.100.0.9" in lines
    assert not any(line.startswith("PATH=") for line in lines)
    start = instance_start_command(runtime, spec, Path("/s"), "job-1")
    assert start[:3] == ["apptainer", "instance", "start"] and start[-2:] == ["/i.sif", "job-1"]
    assert instance_exec_command(runtime, spec, "job-1")[:5] == [
        "apptainer", "exec", "--pwd", "/workspace", "instance://job-1"]
    assert instance_stop_command(runtime, "job-1", 5.0) == [
        "apptainer", "instance", "stop", "--signal", "SIGTERM", "--timeout", "5", "job-1"]


def test_apptainer_unavailable_here_says_why():
    runtime = ApptainerRuntime(binary="no-such-apptainer-binary")
    assert not runtime.available() and "PATH" in runtime.available().reason
    with pytest.raises(RuntimeUnavailable):
        make_runtime("apptainer", binary="no-such-apptainer-binary")
    with pytest.raises(RuntimeUnavailable, match="unknown runtime"):
        make_runtime("docker")


# -- loopback addresses --------------------------------------------------------------------------------

def _allocate_many(path: str, worker: int, count: int) -> list[str]:
    allocator = FileAddressAllocator(path)
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda i: allocator.allocate(f"w{worker}-{i}"), range(count)))


def _release_all(path: str, addresses: list[str]) -> None:
    allocator = FileAddressAllocator(path)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(allocator.release, addresses))


def test_file_allocator_500_concurrent_from_several_processes(tmp_path):
    path = str(tmp_path / "leases.json")
    context = multiprocessing.get_context("fork")
    with context.Pool(5) as pool:
        batches = pool.starmap(_allocate_many, [(path, worker, 100) for worker in range(5)])
        addresses = [a for batch in batches for a in batch]
        assert len(addresses) == 500 and len(set(addresses)) == 500
        assert all(a.startswith("127.100.") and a != "127.0.0.1" for a in addresses)
        assert len(FileAddressAllocator(path).leases()) == 500
        pool.starmap(_release_all, [(path, batch) for batch in batches])
    assert FileAddressAllocator(path).leases() == {}


def test_allocators_reuse_released_and_report_exhaustion(tmp_path):
    for allocator in (MemoryAddressAllocator("127.9.9.0/30"), FileAddressAllocator(tmp_path / "l", "127.9.9.0/30")):
        first, second = allocator.allocate("a"), allocator.allocate("b")
        assert (first, second) == ("127.9.9.1", "127.9.9.2")
        with pytest.raises(AddressExhausted):
            allocator.allocate("c")
        allocator.release(first)
        assert allocator.allocate("d") == first and allocator.leases() == {first: "d", second: "b"}
    with pytest.raises(ValueError, match="127.0.0.0/8"):
        MemoryAddressAllocator("10.0.0.0/24")


# -- ledger, reaper and /proc termination on plain processes -------------------------------------------

def _tree() -> subprocess.Popen:
    """A small process tree: a shell with a child that ignores SIGTERM and a setsid grandchild."""
    script = "(trap '' TERM; sleep 300) & setsid sleep 301 & sleep 302"
    process = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    assert procfs.wait_until(lambda: len(procfs.members(ProcessRef.of(process.pid))) >= 4, 10)
    return process


def test_terminate_escalates_and_leaves_nothing():
    process = _tree()
    root = ProcessRef.of(process.pid)
    seen = procfs.members(root)
    started = time.monotonic()
    assert procfs.terminate(root, grace_s=0.5, popen=process) == []
    assert 0.4 < time.monotonic() - started < 10  # the TERM-ignoring child needed SIGKILL
    for info in seen:
        now = procfs.read_stat(info.pid)
        assert now is None or now.start_time != info.start_time or now.state in "ZX"


def test_process_ref_survives_pid_reuse_checks():
    ref = ProcessRef.of(os.getpid())
    assert procfs.is_alive(ref)
    assert not procfs.is_alive(ref.model_copy(update={"start_time": ref.start_time + 1}))
    assert ProcessRef.of(2 ** 22 + 1) is None


def test_failed_stops_back_off_boundedly_and_are_due_whatever_their_owner():
    assert [retry_delay(n) for n in (1, 2, 3, 6, 7, 10**6)] == [1, 2, 4, 32, 60, 60]
    dead = subprocess.Popen(["true"])
    dead.wait()
    live, gone = ProcessRef.of(os.getpid()), ProcessRef(pid=dead.pid, start_time=1)
    record = SandboxRecord(sandbox_id="s", node="n", job_id="j", worker="w", owner=live, runtime="t", root=None)
    now = time.time()
    assert not due(record, now) and due(record.model_copy(update={"owner": gone}), now)
    failed = record.model_copy(update={"stop_failures": 3, "retry_at": now + 5})
    assert not due(failed, now) and due(failed, now + 5)  # retried although its owner lives
    assert not due(failed.model_copy(update={"owner": gone}), now)  # the backoff holds for the dead too


def test_a_dead_owners_sandbox_is_reaped_only_once_no_job_holds_it(tmp_path):
    """The owner is who stops a sandbox, not what keeps it alive: the caller's ``still_needed``
    keeps a dead owner's sandbox (a job INIT handed to RUN), and is asked only for dead owners;
    a failed stop whose retry is due is retried whatever it says."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    live, gone = ProcessRef.of(os.getpid()), ProcessRef(pid=dead.pid, start_time=1)
    record = SandboxRecord(sandbox_id="s", node="n", job_id="j", worker="w", owner=gone, runtime="t", root=None)
    asked: list[str] = []

    def held(entry: SandboxRecord) -> bool:
        asked.append(entry.sandbox_id)
        return True
    now = time.time()
    assert due(record, now) and not due(record, now, still_needed=held) and asked == ["s"]
    assert not due(record.model_copy(update={"owner": live}), now, still_needed=held) and asked == ["s"]
    failed = record.model_copy(update={"stop_failures": 1, "retry_at": now})
    assert due(failed, now, still_needed=held) and asked == ["s"]
    let_go: list[str] = []

    def released(entry: SandboxRecord) -> bool:
        let_go.append(entry.sandbox_id)
        return True
    assert due(record.model_copy(update={"owner": live}), now, released=released) and let_go == ["s"]
    assert due(record, now, released=lambda entry: False) and let_go == ["s"]  # asked of live owners only

    ledger = FileSandboxLedger(tmp_path / "ledger")
    handed, orphan = _tree(), _tree()
    for name, process in (("handed", handed), ("orphan", orphan)):
        ledger.record(record.model_copy(update={"sandbox_id": name, "root": ProcessRef.of(process.pid)}))
    try:
        [report] = reap(ledger, "n", grace_s=0.5, still_needed=lambda entry: entry.sandbox_id == "handed")
        assert report.sandbox_id == "orphan" and report.left == []
        orphan.wait(timeout=10)
        assert [r.sandbox_id for r in ledger.list("n")] == ["handed"]
        assert procfs.members(ProcessRef.of(handed.pid))  # untouched: its job still holds it
        [report] = reap(ledger, "n", grace_s=0.5, still_needed=lambda entry: False)  # the job let go
        assert report.sandbox_id == "handed" and report.left == [] and ledger.list("n") == []
        handed.wait(timeout=10)
    finally:
        for process in (handed, orphan):
            procfs.terminate(ProcessRef.of(process.pid), grace_s=0, popen=process)


def test_ledger_and_reaper_on_plain_processes(tmp_path):
    ledger, allocator = FileSandboxLedger(tmp_path / "ledger"), FileAddressAllocator(tmp_path / "leases")
    dead = subprocess.Popen(["true"])
    dead.wait()
    dead_owner = ProcessRef(pid=dead.pid, start_time=1)
    orphan, kept = _tree(), _tree()
    address = allocator.allocate("orphan")
    common = dict(node="n1", job_id="j", worker="w", runtime="test")
    ledger.record(SandboxRecord(sandbox_id="orphan", owner=dead_owner, root=ProcessRef.of(orphan.pid),
                                address=address, **common))
    ledger.record(SandboxRecord(sandbox_id="kept", owner=ProcessRef.of(os.getpid()),
                                root=ProcessRef.of(kept.pid), **common))
    (tmp_path / "ledger" / "n1" / "torn.json").write_text("{not json")
    try:
        [report] = reap(ledger, "n1", allocator=allocator, grace_s=0.5)
        assert report.sandbox_id == "orphan" and len(report.killed) >= 4 and report.left == []
        orphan.wait(timeout=10)
        assert [r.sandbox_id for r in ledger.list("n1")] == ["kept"] and allocator.leases() == {}
        assert procfs.members(ProcessRef.of(kept.pid))
    finally:
        procfs.terminate(ProcessRef.of(kept.pid), grace_s=0, popen=kept)
    ledger.remove("n1", "kept")
    ledger.remove("n1", "kept")  # no error the second time
    assert ledger.list("n1") == [] and ledger.list("other-node") == []


def test_subreaper_keeps_daemons_as_descendants(tmp_path):
    script = Path(__file__).resolve().parents[2] / "singularity" / "runtime" / "_subreaper.py"
    process = subprocess.Popen([sys.executable, "-I", "-S", str(script), "sh", "-c",
                                "setsid sh -c 'sleep 303 &' ; sleep 304"], start_new_session=True)
    root = ProcessRef.of(process.pid)
    assert procfs.wait_until(lambda: any(procfs.read_stat(i.pid) and open(f"/proc/{i.pid}/cmdline").read()
                                         .startswith("sleep\x00303") for i in procfs.members(root)), 10)
    assert procfs.terminate(root, grace_s=1.0, popen=process) == []
    assert process.returncode is not None


def test_a_set_up_child_left_in_the_roots_session_is_a_member_after_the_root_dies(tmp_path) -> None:
    """bubblewrap killed mid-start leaves its inner child, reparented and waiting for a parent
    that is gone: only the session (the root's, from start_new_session) still names it."""
    ready = tmp_path / "child.pid"
    root = subprocess.Popen(["sh", "-c", f"sleep 60 & echo $! > {ready}; sleep 0.3"], start_new_session=True)
    root_ref = procfs.ProcessRef.of(root.pid)
    assert root_ref is not None
    root.wait(10)
    child = int(ready.read_text())
    try:
        assert child in [info.pid for info in procfs.members(root_ref)]
        assert procfs.terminate(root_ref, None, [], 1.0, None) == []
        assert procfs.read_stat(child) is None or procfs.read_stat(child).state in "ZX"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
