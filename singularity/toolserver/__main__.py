"""``python -m singularity.toolserver --socket PATH --workspace DIR [options]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .protocol import MAX_FRAME, SEARCH_CORPUS_ENV
from .server import DEFAULT_MAX_OUTPUT, ServerConfig, serve

MAX_OUTPUT_LIMIT = MAX_FRAME // 8  # stdout + stderr of a cell, JSON-escaped, fit in a frame


def parse_args(argv: list[str] | None = None) -> tuple[ServerConfig, str]:
    parser = argparse.ArgumentParser(
        prog="python -m singularity.toolserver",
        description="The tool server that runs inside a sandbox.",
    )
    parser.add_argument("--socket", type=Path, help="Unix socket path to listen on")
    parser.add_argument(
        "--tcp", metavar="HOST:PORT", help="also (or only) listen on TCP (port 0 = any free port)"
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        required=True,
        help="the directory the tools work in (editor paths are confined to it)",
    )
    parser.add_argument(
        "--search-corpus", type=Path, default=os.environ.get(SEARCH_CORPUS_ENV) or None,
        help=f"JSONL of {{id, title, text}} for BM25 search (default: ${SEARCH_CORPUS_ENV})",
    )
    parser.add_argument(
        "--search-url", help="HTTP search service (POST {query, k}) instead of BM25"
    )
    parser.add_argument(
        "--max-output",
        type=int,
        default=DEFAULT_MAX_OUTPUT,
        help=f"bytes of output kept per call (default {DEFAULT_MAX_OUTPUT})",
    )
    parser.add_argument("--shell", default="/bin/bash", help="the shell behind the bash tool")
    parser.add_argument(
        "--lazy-shell",
        action="store_true",
        help="start the shell on the first bash call, not right after READY",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    if args.socket is None and args.tcp is None:
        parser.error("give --socket, --tcp or both")
    if not args.workspace.is_dir():
        parser.error(f"--workspace {args.workspace} is not a directory")
    if not 1024 <= args.max_output <= MAX_OUTPUT_LIMIT:
        parser.error(f"--max-output must be between 1024 and {MAX_OUTPUT_LIMIT}")
    return ServerConfig(
        workspace=args.workspace,
        socket=args.socket,
        tcp=_host_port(parser, args.tcp),
        search_corpus=args.search_corpus,
        search_url=args.search_url,
        max_output=args.max_output,
        shell=args.shell,
        prestart_shell=not args.lazy_shell,
    ), args.log_level


def _host_port(parser: argparse.ArgumentParser, value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--tcp wants HOST:PORT, got {value!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    config, level = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=level.upper(),
        format="%(asctime)s toolserver %(levelname)s %(message)s",
    )
    return serve(config)


if __name__ == "__main__":
    status = main()
    # Everything the server owns is already released (shell killed, socket removed, kernel shut
    # down): skip the interpreter's finalization, which takes 0.1-0.5 s with IPython loaded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
