"""The ``search`` tool and its pluggable backends.

A backend is anything with ``search(query, k) -> list[{"id", "title", "text", "score"}]``
(:class:`SearchBackend`); it is called in a worker thread, so it may block.

* :class:`BM25Backend` (the default, offline): a local JSONL collection of
  ``{"id", "title", "text"}`` (``--search-corpus``), indexed with BM25 by the ``bm25s`` library
  (English stop words, no stemming) on the first search, so the server starts without loading
  numpy and scipy; documents with a zero score are never returned.
* :class:`HTTPSearchBackend` (``--search-url``): POSTs ``{"query", "k"}`` as JSON to a
  configured URL and expects ``{"results": [hit, ...]}`` (or a bare list) back. It uses only
  the standard library so the sandbox image needs nothing more.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from .errors import ToolError
from .protocol import SearchArgs, SearchHit, SearchResult, ValidationError

if TYPE_CHECKING:
    import bm25s  # imported at the first search only: the server's start-up stays light


@runtime_checkable
class SearchBackend(Protocol):
    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        """The ``k`` best documents for ``query``, best first, as {"id","title","text","score"}."""


class BM25Backend:
    """BM25 over a JSONL document collection, indexed lazily on the first search."""

    def __init__(self, corpus: Path) -> None:
        self.corpus = corpus
        self._docs: list[dict[str, str]] = []
        self._index: bm25s.BM25 | None = None
        self._lock = threading.Lock()

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        import bm25s

        self._ensure_index()
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
        if not self._docs or not tokens[0]:
            return []
        assert self._index is not None  # built by _ensure_index
        ids, scores = self._index.retrieve(tokens, k=min(k, len(self._docs)), show_progress=False)
        return [
            dict(self._docs[int(i)], score=float(s)) for i, s in zip(ids[0], scores[0]) if s > 0
        ]

    def warm(self) -> None:
        """Build the index now (a warm pool's sandbox), not on the first search."""
        self._ensure_index()

    def _ensure_index(self) -> None:
        with self._lock:
            if self._index is not None:
                return
            import bm25s

            self._docs = load_corpus(self.corpus)
            index = bm25s.BM25()
            if self._docs:
                texts = [f"{d['title']}\n{d['text']}" for d in self._docs]
                index.index(
                    bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False
                )
            self._index = index


def load_corpus(path: Path) -> list[dict[str, str]]:
    """Read a JSONL collection; each line needs "text", and "id"/"title" default sensibly."""
    docs = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                raw = msgspec.json.decode(line)
                docs.append(
                    {
                        "id": str(raw.get("id", number)),
                        "title": str(raw.get("title", "")),
                        "text": str(raw["text"]),
                    }
                )
            except (ValueError, KeyError, AttributeError) as exc:
                raise ToolError(
                    f"{path}:{number}: not a {{'id','title','text'}} object ({exc})",
                    "search_failed",
                ) from exc
    return docs


class HTTPSearchBackend:
    """A remote search service: POST {"query", "k"} -> {"results": [hit, ...]}."""

    def __init__(
        self, url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None
    ) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        import urllib.error
        import urllib.request

        body = msgspec.json.encode({"query": query, "k": k})
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = msgspec.json.decode(response.read())
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
            raise ToolError(f"search service {self.url} failed: {exc}", "search_failed") from exc
        hits = payload.get("results") if isinstance(payload, dict) else payload
        if not isinstance(hits, list):
            raise ToolError(
                f"search service {self.url} answered without a results list", "search_failed"
            )
        return [_known_fields(hit) for hit in hits[:k]]


def _known_fields(hit: Any) -> Any:
    """Keep a remote hit's four fields (a service may add its own); ids become strings."""
    if not isinstance(hit, dict):
        return hit
    kept = {key: hit[key] for key in ("id", "title", "text", "score") if key in hit}
    if "id" in kept:
        kept["id"] = str(kept["id"])
    return kept


class SearchTool:
    def __init__(self, backend: SearchBackend | None) -> None:
        self.backend = backend

    async def warm(self) -> bool:
        """Index the corpus now, when the backend has one to index; whether it did."""
        warm = getattr(self.backend, "warm", None)
        if warm is None:
            return False
        await asyncio.to_thread(warm)
        return True

    async def __call__(self, args: SearchArgs) -> SearchResult:
        if self.backend is None:
            raise ToolError(
                "no search backend configured (start the server with "
                "--search-corpus or --search-url)",
                "search_unavailable",
            )
        hits = await asyncio.to_thread(self.backend.search, args.query, args.k)
        try:
            return SearchResult(hits=[SearchHit.parse(hit) for hit in hits])
        except ValidationError as exc:  # a ValueError
            raise ToolError(
                f"the search backend returned a malformed hit: {exc}", "search_failed"
            ) from exc
