#!/usr/bin/env bash
# Install the agent harnesses that the `agent` family runs unchanged (Claude Code, Codex,
# OpenCode) from npm, pinned, into a cache directory of their own. Idempotent: a harness whose
# pinned version is already there is not fetched again.
#
# Each npm package ships its native binary in a per-platform optional dependency (a binary
# inside a registry package, no download from elsewhere), so the binaries run without Node.js
# at run time; npm and node (Debian's, node 20) are needed only to install. Claude Code's
# package declares node>=22 for its postinstall, which only links the native binary and works
# on node 20: --engine-strict stays off.
#
#   PRORL_HARNESS_DIR   where they go (default ~/.cache/prorl-celery/harnesses)
#   PRORL_HARNESSES     which ones (default "claude-code codex opencode")
#
# Layout: $PRORL_HARNESS_DIR/<name>/node_modules/.bin/<bin>; the handler finds them there
# (handlers/agent_program/harnesses.py: harness_dir() and each Harness's bin). Prints the
# directory on the last line. What each harness is configured with: docs/agents.md, section
# "Claude Code, Codex and OpenCode".
set -euo pipefail
dir="${PRORL_HARNESS_DIR:-$HOME/.cache/prorl-celery/harnesses}"
want="${PRORL_HARNESSES:-claude-code codex opencode}"

# name package version: the pins tests/integration/test_harnesses.py ran; the same as each
# Harness of handlers/agent_program/harnesses.py (tests/unit/test_scripts.py checks both agree)
pins=(
  "claude-code @anthropic-ai/claude-code 2.1.332"
  "codex @openai/codex 0.171.0"
  "opencode opencode-ai 1.18.33"
)

command -v npm >/dev/null || { echo "install_harnesses: npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$dir"
for pin in "${pins[@]}"; do
  read -r name package version <<<"$pin"
  [[ " $want " == *" $name "* ]] || continue
  target="$dir/$name"
  stamp="$package@$version"
  if [[ -f "$target/.installed" && "$(cat "$target/.installed")" == "$stamp" ]]; then
    continue
  fi
  rm -rf "$target"
  mkdir -p "$target"
  # a package.json of its own so npm does not walk up into another project
  echo '{"name":"prorl-harness-'"$name"'","private":true}' >"$target/package.json"
  npm install --prefix "$target" --no-audit --no-fund --loglevel=error --omit=dev \
    "$package@$version" >&2
  echo "$stamp" >"$target/.installed"
done
echo "$dir"
