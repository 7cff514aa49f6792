"""The documents stay true to the code they describe.

- ``docs/configuration.md``'s tables name every field of ``Settings`` as ``PRORL_<FIELD>``, and
  every ``PRORL_*`` row there is a field, or one of the variables read outside ``Settings``
  listed below with the file that reads it.
- Every relative link of the README and the pages beside it points to a file that exists.

Reads files only: no process, no network.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from prorl_celery.core.settings import Settings
from tests.support.doc_blocks import shown_files

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
#: the documents whose links are checked
DOCUMENTS = sorted({ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md",
                    *(ROOT / "bench" / "results").glob("*.md"), ROOT / "deploy" / "README.md"})

#: PRORL_* variables documented in docs/configuration.md that are not Settings fields -> the file
#: that reads (or sets) them; each must still be named in that file
KNOWN_EXTRAS: dict[str, str] = {
    # gunicorn's, read by its master before any service module is imported
    "PRORL_GATEWAY_BIND": "api/gunicorn_conf.py",
    "PRORL_GATEWAY_WORKERS": "api/gunicorn_conf.py",
    "PRORL_GATEWAY_WORKER_CLASS": "api/gunicorn_conf.py",
    "PRORL_GATEWAY_CONNECTIONS": "api/gunicorn_conf.py",
    "PRORL_GATEWAY_THREADS": "api/gunicorn_conf.py",
    # inside a sandbox, set for the program that runs there
    "PRORL_LLM_MODEL": "singularity/toolserver/agentrun.py",
    "PRORL_TASK_FILE": "handlers/agent_program/instances.py",
    "PRORL_SANDBOX_ADDRESS": "singularity/runtime/base.py",
    # prorl up's own redis-server (click options), and the Slurm head node's
    "PRORL_REDIS_PERSISTENCE": "prorl_celery/cli.py",
    "PRORL_REDIS_DIR": "prorl_celery/cli.py",
    "PRORL_REDIS_PASSWORD": "deploy/slurm/head.sh",
    "PRORL_REDIS_REPLICATION": "deploy/slurm/prorl.sbatch",
    # the verl agent loop, in the trainer's process
    "PRORL_GATEWAY_URL": "prorl_celery/trainer/integrations/verl.py",
    "PRORL_MAX_RESUBMITS": "prorl_celery/trainer/integrations/verl.py",
    "PRORL_TRAIN_AUXILIARY": "prorl_celery/trainer/integrations/verl.py",
    # the vLLM and verl venvs of the tests and CI
    "PRORL_VLLM_VENV": "scripts/install_vllm.sh",
    "PRORL_VLLM_VERSION": "scripts/install_vllm.sh",
    "PRORL_REQUIRE_VLLM": "tests/support/vllm.py",
    "PRORL_REQUIRE_SLURM": "tests/integration/test_slurm.py",
    "PRORL_HARNESS_DIR": "handlers/agent_program/harnesses.py",
    "PRORL_REQUIRE_HARNESSES": "tests/support/harnesses.py",
    "PRORL_HARNESSES": "scripts/install_harnesses.sh",
    "PRORL_VERL_PYTHON": "tests/support/vllm.py",
    "PRORL_VERL_VENV": "scripts/install_verl.sh",
    "PRORL_VERL_VERSION": "scripts/install_verl.sh",
}

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
VARIABLE = re.compile(r"`([A-Z][A-Z0-9_]*)`")


def documented_variables() -> set[str]:
    """The variables named in the first cell of a table row of docs/configuration.md."""
    names = set()
    for line in CONFIGURATION.read_text().splitlines():
        if line.startswith("| `"):
            names.update(VARIABLE.findall(line.split("|")[1]))
    return names


def test_every_setting_has_a_row():
    documented = documented_variables()
    missing = sorted(f"PRORL_{field.upper()}" for field in Settings.model_fields
                     if f"PRORL_{field.upper()}" not in documented)
    assert not missing, f"Settings fields without a row in docs/configuration.md: {missing}"


def test_every_prorl_row_is_a_setting_or_a_known_extra():
    fields = {f"PRORL_{field.upper()}" for field in Settings.model_fields}
    unknown = sorted(name for name in documented_variables()
                     if name.startswith("PRORL_") and name not in fields and name not in KNOWN_EXTRAS)
    assert not unknown, (f"rows of docs/configuration.md that name no Settings field: {unknown} "
                         f"(a variable read elsewhere goes into KNOWN_EXTRAS with the file that reads it)")


@pytest.mark.parametrize("name", sorted(KNOWN_EXTRAS))
def test_a_known_extra_is_documented_and_read_where_it_says(name):
    assert name not in {f"PRORL_{field.upper()}" for field in Settings.model_fields}, \
        f"{name} is a Settings field now: drop it from KNOWN_EXTRAS"
    assert name in documented_variables(), f"{name} has no row in docs/configuration.md"
    assert name in (ROOT / KNOWN_EXTRAS[name]).read_text(), f"{KNOWN_EXTRAS[name]} no longer names {name}"


def relative_links(document: Path) -> list[str]:
    """The targets of the document's Markdown links and images, code left out, that are paths."""
    text = CODE_SPAN.sub("", FENCE.sub("", document.read_text()))
    return [target for target in LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_point_to_files_that_exist(document):
    broken = [target for target in relative_links(document)
              if not (document.parent / target.split("#", 1)[0]).exists()]
    assert not broken, f"{document.relative_to(ROOT)}: links to nothing: {broken}"


def test_the_checks_see_the_documents():
    """A parser that silently found nothing would pass everything above."""
    assert len(documented_variables()) > 40
    assert "docs/configuration.md" in relative_links(ROOT / "README.md")


def readme_command(number: int) -> str:
    """The line under ``# <number>.`` in the README's first code block."""
    lines = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith(f"# {number}.")) + 1]


def test_readme_command_1_is_one_line_with_its_virtualenv_and_the_checked_install():
    """Command 1 pastes as one line on a stock Debian (whose system pip refuses installs: it makes
    a venv first), and its pip install is the one CI's user-install check runs."""
    steps = readme_command(1).split(" && ")
    venv = steps.index("python3 -m venv .venv")
    assert steps[venv + 1] == ". .venv/bin/activate"
    pip = next(step for step in steps[venv:] if step.startswith("pip install"))
    assert steps[-1] == "prorl demo"
    checked = (ROOT / "scripts" / "user_install_check.sh").read_text()
    install = re.search(r"^install=\(-m pip install -q (.*)\)$", checked, re.M).group(1)
    assert pip == f"pip install {install}"
    assert "redis-server" in steps[1] and "python3-venv" in steps[1]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_blocks_marked_as_a_file_show_that_file(document):
    """``<!-- example: FILE -->`` before a block: the block is FILE, whole; ``excerpt``: a part of
    it. The tests run the files, so what a page shows is what runs."""
    for kind, name, block in shown_files(document):
        content = (ROOT / name).read_text()
        if kind == "example":
            assert block.code == content, f"{document.name}:{block.line} differs from {name}"
        else:
            assert block.code in content, f"{document.name}:{block.line} is not a part of {name}"


def test_the_guides_show_their_example_files():
    assert {name for _, name, _ in shown_files(ROOT / "docs" / "trainer.md")} >= {
        "examples/trainer/client.py", "examples/trainer/trl_grpo.py", "examples/trainer/verl_agent_loop.py",
        "examples/train_loop.py"}
