"""What the scripts under scripts/ say of the repository holds (issue 37:
``install_harnesses.sh`` cited two files that did not exist)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from handlers.agent_program.harnesses import HARNESSES

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(path for path in (ROOT / "scripts").rglob("*") if path.is_file() and path.suffix in {".sh", ".py"})
#: a repository path: folders and a file with an extension. One after ``/``, ``~``, ``$`` or a
#: brace is under another root (``$dir/...``, ``~/.cache/...``, ``/opt/...``), not the repository's
CITED = re.compile(r"(?<![\w./~${}-])((?:[\w.-]+/)+[\w-]+\.(?:py|md|sh|json|toml|cfg|txt|ya?ml|lua|j2|def))\b")
#: ``"<name> <package> <version>"``, a line of install_harnesses.sh's ``pins``
PIN = re.compile(r'^\s*"([\w-]+) (\S+) (\S+)"$', re.M)


def test_the_check_sees_the_scripts():
    cited = [match for script in SCRIPTS for match in CITED.findall(script.read_text())]
    assert len(SCRIPTS) >= 8 and len(cited) >= 10, (SCRIPTS, cited)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_path_a_script_cites_exists(script):
    missing = [path for path in CITED.findall(script.read_text()) if not (ROOT / path).exists()]
    assert not missing, f"{script.relative_to(ROOT)} cites {missing}, which are not in the repository"


def test_the_harness_pins_are_the_handlers():
    """The script installs the versions the handler asks for, else every harness job fails with
    'run scripts/install_harnesses.sh' after it ran."""
    pins = {name: (package, version)
            for name, package, version in PIN.findall((ROOT / "scripts" / "install_harnesses.sh").read_text())}
    assert pins == {name: (h.package, h.version) for name, h in HARNESSES.items()}
