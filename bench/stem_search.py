"""The stem task's first search: what indexing the shipped corpus costs, against a warm search.

The tool server builds its BM25 index lazily, on the first ``search`` (importing ``bm25s``,
numpy and scipy, reading ``handlers/stem/data/corpus.jsonl`` and indexing it), so the first
search of every stem job pays it and later searches do not. Each round starts a fresh tool
server on the shipped corpus (a plain process: the index build is the same code inside a
sandbox) and times, through the client, the first search and then warm searches of the shipped
questions; a fresh server on a one-document corpus gives the first-search cost that is import
alone. Prints the three and the ratios.

    python -m bench.stem_search [--rounds 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from handlers.stem import DATA_DIR
from singularity.toolserver.client import ToolClient
from singularity.toolserver.launch import LocalToolServer

CORPUS = DATA_DIR / "corpus.jsonl"
QUESTIONS = [json.loads(line)["question"] for line in (DATA_DIR / "questions.jsonl").open(encoding="utf-8")]


async def one_round(tmp: Path, corpus: Path = CORPUS) -> tuple[float, list[float]]:
    workspace = tmp / "workspace"
    workspace.mkdir()
    server = LocalToolServer.start(tmp / "tools.sock", workspace, search_corpus=corpus)
    try:
        async with ToolClient(server.socket) as client:
            await client.ping()
            started = time.perf_counter()
            await client.search(QUESTIONS[0], k=5)
            first = time.perf_counter() - started
            warm = []
            for question in QUESTIONS:
                started = time.perf_counter()
                await client.search(question, k=5)
                warm.append(time.perf_counter() - started)
            return first, warm
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    firsts, warms, imports = [], [], []
    for _ in range(args.rounds):  # alternating, so load drift hits both sides
        with tempfile.TemporaryDirectory() as tmp:
            first, warm = asyncio.run(one_round(Path(tmp)))
        firsts.append(first)
        warms += warm
        with tempfile.TemporaryDirectory() as tmp:
            tiny = Path(tmp) / "one.jsonl"
            tiny.write_text(CORPUS.open(encoding="utf-8").readline(), encoding="utf-8")
            imports.append(asyncio.run(one_round(Path(tmp), tiny))[0])
    docs = sum(1 for _ in CORPUS.open(encoding="utf-8"))
    first_ms, warm_ms = statistics.median(firsts) * 1e3, statistics.median(warms) * 1e3
    print(f"corpus: {docs} documents, {args.rounds} fresh servers, {len(warms)} warm searches")
    print(f"first search (import + index) median {first_ms:.1f} ms (min {min(firsts) * 1e3:.1f}, "
          f"max {max(firsts) * 1e3:.1f})")
    import_ms = statistics.median(imports) * 1e3
    print(f"first search on a 1-document corpus (import only) median {import_ms:.1f} ms")
    print(f"warm search median {warm_ms:.2f} ms (max {max(warms) * 1e3:.2f})")
    print(f"ratio first / warm: {first_ms / warm_ms:.0f}x; first on the corpus / first on 1 document: "
          f"{first_ms / import_ms:.2f}x (indexing {docs} documents costs {first_ms - import_ms:.0f} ms)")


if __name__ == "__main__":
    main()
