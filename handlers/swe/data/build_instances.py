"""Build the shipped SWE instances from ``sources/``: one git bundle per repository and
``instances.jsonl`` in the SWE-bench format.

Each ``sources/<name>/`` holds
    base/        the repository at the base commit (package, tests/, README, pyproject)
    fix/         the files the gold patch changes, in their fixed form
    test_patch/  the test files the test patch changes, in their final form
    meta.json    owner, issue number, version, created_at, problem_statement

The repository gets two commits (the code, then its tests) with fixed authors and dates, so
the commit ids, and therefore ``base_commit``, are the same on every machine. The gold patch
and the test patch are ``git diff`` of the overlays against the base commit. FAIL_TO_PASS and
PASS_TO_PASS are derived as SWE-bench derives them: the test files are run with the test patch
applied, once without and once with the gold patch; tests that fail before and pass after are
FAIL_TO_PASS, tests that pass in both runs PASS_TO_PASS. The build fails when a source has no
FAIL_TO_PASS test or the gold patch leaves a test failing.

``verl_sample.jsonl`` holds the same instances as verl rows (SWE-Gym style: ``prompt`` messages,
``reward_model.ground_truth`` = the gold patch, the SWE-bench fields in ``extra_info``).

    python handlers/swe/data/build_instances.py           # rebuild bundles and both JSONL files
    python handlers/swe/data/build_instances.py --check   # rebuild elsewhere, compare with shipped
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the project root, for handlers.swe.evaluation

from handlers.swe.evaluation import ERROR, FAILED, PASSED, files_of_tests, parse_junit  # noqa: E402

SOURCES = HERE / "sources"
AUTHOR = ("Ada Maintainer", "ada@example.org")
#: git must not read the builder's own configuration (hooks, signing, autocrlf, templates)
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TEMPLATE_DIR": "",
           "GIT_AUTHOR_NAME": AUTHOR[0], "GIT_AUTHOR_EMAIL": AUTHOR[1],
           "GIT_COMMITTER_NAME": AUTHOR[0], "GIT_COMMITTER_EMAIL": AUTHOR[1], "TZ": "UTC"}
IGNORED = {"__pycache__", ".pytest_cache"}
#: the repositories are stdlib-only: pytest need not load the plugins installed next to it
TEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout


def files_of(tree: Path) -> list[Path]:
    return sorted(p.relative_to(tree) for p in tree.rglob("*")
                  if p.is_file() and not IGNORED.intersection(p.relative_to(tree).parts))


def copy_files(tree: Path, into: Path, keep=lambda rel: True) -> None:
    for rel in files_of(tree):
        if keep(rel):
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            (into / rel).write_bytes((tree / rel).read_bytes())


def overlay_diff(repo: Path, tree: Path) -> str:
    """``git diff`` of ``tree``'s files copied over the checkout; the checkout is reset after."""
    copy_files(tree, repo)
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached", "HEAD")
    git(repo, "reset", "-q", "--hard", "HEAD")
    if not diff:
        raise RuntimeError(f"{tree} changes nothing")
    return diff


def run_tests(repo: Path, patches: list[str], files: list[str]) -> dict[str, str]:
    """Statuses of the tests in ``files`` on a copy of ``repo`` with ``patches`` applied."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        git(repo, "worktree", "add", "-q", "--detach", str(work), "HEAD")
        try:
            for patch in patches:
                subprocess.run(["git", "apply", "-"], cwd=work, input=patch, text=True, check=True)
            junit = Path(tmp) / "junit.xml"
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                            "junit_family=xunit1", f"--junitxml={junit}", *files], cwd=work,
                           env={**os.environ, **TEST_ENV, "PYTHONDONTWRITEBYTECODE": "1"},
                           capture_output=True, timeout=300)
            return parse_junit(junit.read_text())
        finally:
            git(repo, "worktree", "remove", "--force", str(work))


def build_one(name: str, out_dir: Path, verify: bool) -> dict:
    source = SOURCES / name
    meta = json.loads((source / "meta.json").read_text())
    created = datetime.fromisoformat(meta["created_at"].replace("Z", "+00:00"))
    repo = out_dir / "work" / name
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    copy_files(source / "base", repo, keep=lambda rel: rel.parts[0] != "tests")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"Initial version of {name}", date=(created - timedelta(days=60)).isoformat())
    copy_files(source / "base", repo, keep=lambda rel: rel.parts[0] == "tests")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Add the test suite", date=(created - timedelta(days=20)).isoformat())
    base_commit = git(repo, "rev-parse", "HEAD").strip()
    patch = overlay_diff(repo, source / "fix")
    test_patch = overlay_diff(repo, source / "test_patch")
    row = {
        "instance_id": f"{meta['owner']}__{name}-{meta['number']}",
        "repo": f"{meta['owner']}/{name}",
        "base_commit": base_commit,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": meta["problem_statement"],
        "hints_text": "",
        "created_at": meta["created_at"],
        "version": meta["version"],
        "environment_setup_commit": base_commit,
        "test_env": TEST_ENV,
    }
    if verify:
        files = sorted({str(p) for p in files_of(source / "base")
                        if p.parts[0] == "tests" and p.name.startswith("test_")})
        before = run_tests(repo, [test_patch], files)
        after = run_tests(repo, [patch, test_patch], files)
        broken = sorted(t for t, s in after.items() if s != PASSED)
        if broken:
            raise RuntimeError(f"{name}: tests fail with the gold patch: {broken}")
        fail_to_pass = sorted(t for t, s in before.items() if s in (FAILED, ERROR) and after.get(t) == PASSED)
        pass_to_pass = sorted(t for t, s in before.items() if s == PASSED and after.get(t) == PASSED)
        if not fail_to_pass:
            raise RuntimeError(f"{name}: no test fails before the gold patch")
        assert set(files_of_tests(fail_to_pass)) <= set(files)
        row["FAIL_TO_PASS"] = json.dumps(fail_to_pass)  # SWE-bench stores them as JSON strings
        row["PASS_TO_PASS"] = json.dumps(pass_to_pass)
    bundle = out_dir / "repos" / f"{name}.bundle"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "-c", "pack.threads=1", "bundle", "create", "-q", str(bundle), "HEAD", "main")
    return row


def build(out_dir: Path, verify: bool = True) -> list[dict]:
    rows = [build_one(source.name, out_dir, verify) for source in sorted(SOURCES.iterdir())
            if (source / "meta.json").exists()]
    shutil.rmtree(out_dir / "work", ignore_errors=True)
    return rows


def write(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def verl_row(row: dict) -> dict:
    """The instance as a verl row: the prompt the handler would build, the fields in extra_info."""
    from handlers.swe.instances import SYSTEM_PROMPT, USER_TEMPLATE
    name = row["repo"].rsplit("/", 1)[1]
    user = USER_TEMPLATE.format(repo=row["repo"], repo_dir=f"/workspace/{name}", name=name,
                                problem_statement=row["problem_statement"].strip())
    return {"data_source": "swe_gym", "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                                                 {"role": "user", "content": user}],
            "ability": "software_engineering",
            "reward_model": {"style": "rule", "ground_truth": row["patch"]},
            "extra_info": {key: value for key, value in row.items() if key != "patch"}}


def check() -> list[str]:
    """Differences between a fresh build and the shipped data (empty when reproducible)."""
    shipped = {row["instance_id"]: row for row in map(json.loads, (HERE / "instances.jsonl").read_text().splitlines())}
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in build(Path(tmp), verify=False):
            old = shipped.pop(row["instance_id"], None)
            if old is None:
                problems.append(f"{row['instance_id']}: not shipped")
                continue
            for key in ("repo", "base_commit", "patch", "test_patch", "problem_statement", "version", "created_at",
                        "test_env"):
                if old.get(key) != row[key]:
                    problems.append(f"{row['instance_id']}: {key} differs")
            name = row["repo"].rsplit("/", 1)[1]
            heads = git(HERE / "repos", "bundle", "list-heads", str(HERE / "repos" / f"{name}.bundle"))
            if row["base_commit"] not in heads:
                problems.append(f"{row['instance_id']}: shipped bundle does not hold {row['base_commit']}")
    problems += [f"{instance_id}: shipped but has no source" for instance_id in shipped]
    rows = [json.loads(line) for line in (HERE / "instances.jsonl").read_text().splitlines()]
    if (HERE / "verl_sample.jsonl").read_text() != "".join(json.dumps(verl_row(r)) + "\n" for r in rows):
        problems.append("verl_sample.jsonl is not the verl form of instances.jsonl")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare a fresh build with the shipped data")
    args = parser.parse_args()
    if args.check:
        problems = check()
        print("\n".join(problems) or "shipped SWE instances are reproducible")
        return 1 if problems else 0
    with tempfile.TemporaryDirectory() as tmp:
        rows = build(Path(tmp))
        shutil.rmtree(HERE / "repos", ignore_errors=True)
        shutil.copytree(Path(tmp) / "repos", HERE / "repos")
    write(rows, HERE / "instances.jsonl")
    write([verl_row(row) for row in rows], HERE / "verl_sample.jsonl")
    for row in rows:
        print(f"{row['instance_id']}: {row['base_commit'][:12]} FAIL_TO_PASS={len(json.loads(row['FAIL_TO_PASS']))} "
              f"PASS_TO_PASS={len(json.loads(row['PASS_TO_PASS']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
