#!/usr/bin/env bash
# The README's test command: install the project with its test extras, build the tokenizer
# fixtures (cached), lint (ruff, mypy), run the default test suite. Tests start their own redis-server, workers,
# gunicorn and LLM servers on loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e '.[test,model]'
prorl fixtures build
# lint the packages (pyproject.toml: ruff over the repository, mypy over the four packages)
python -m ruff check .
python -m mypy
python -m pytest --durations=25 "$@"
