#!/usr/bin/env bash
# The README's test command: install the project with its test extras, build the tokenizer
# fixtures (cached), lint (ruff, mypy), run the default test suite and the extended tests.
# Tests start their own redis-server, workers, gunicorn and LLM servers on loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e '.[test,model]'
prorl fixtures build
# lint the packages (pyproject.toml: ruff over the repository, mypy over the four packages)
python -m ruff check .
python -m mypy
# the default run (kept under 10 minutes: it prints its slowest tests), then, for a whole run
# (no arguments), the extended tests it leaves out: the real-vLLM suite and a few long runs
status=0
python -m pytest --durations=15 "$@" || status=$?
if (($# == 0)); then
  python -m pytest --durations=10 -m extended || status=$?
fi
exit "$status"
