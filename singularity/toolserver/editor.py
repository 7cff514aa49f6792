"""The ``editor`` tool: view, create, str_replace, insert and undo, confined to the workspace.

Paths are relative to the workspace (absolute paths are accepted only if they lie inside it).
Every path is resolved (``..`` collapsed, symlinks followed) before use, and anything that ends
up outside the workspace fails with ``path_outside_workspace``: ``../x``, ``/etc/passwd`` and a
symlink pointing out all do. (A symlink swapped in between the check and the write could still
escape; inside a sandbox the workspace is the only writable place anyway.)

Each successful create/str_replace/insert records the file's previous content (``None`` for a
new file); ``undo`` restores the latest one of that file (deleting a file that an undone
``create`` made). History is kept in memory, per file, at most :data:`UNDO_DEPTH` deep.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from .errors import ToolError
from .protocol import (
    CreateArgs,
    EditorResult,
    InsertArgs,
    StrReplaceArgs,
    UndoArgs,
    ViewArgs,
)

UNDO_DEPTH = 20
SNIPPET_LINES = 4
MAX_LISTED = 500


class Editor:
    def __init__(self, workspace: Path, max_output: int) -> None:
        self.workspace = workspace.resolve()
        self.max_output = max_output
        self._history: dict[Path, list[str | None]] = defaultdict(list)

    async def __call__(self, args) -> EditorResult:
        handler = getattr(self, f"_{args.command}")
        path = self.resolve(args.path)
        output = handler(path, args)
        truncated = len(output) > self.max_output
        if truncated:
            dropped = len(output) - self.max_output
            output = output[: self.max_output] + f"\n[... {dropped} characters dropped ...]"
        return EditorResult(output=output, path=self._relative(path), truncated=truncated)

    def resolve(self, raw: str) -> Path:
        """The real path of ``raw`` inside the workspace, or ``path_outside_workspace``."""
        candidate = Path(raw) if os.path.isabs(raw) else self.workspace / raw
        real = candidate.resolve()
        if real != self.workspace and not real.is_relative_to(self.workspace):
            raise ToolError(
                f"{raw!r} resolves to {str(real)!r}, outside the workspace {str(self.workspace)!r}",
                "path_outside_workspace",
            )
        return real

    # -- commands --------------------------------------------------------------------------------

    def _view(self, path: Path, args: ViewArgs) -> str:
        if path.is_dir():
            if args.view_range is not None:
                raise ToolError("view_range does not apply to a directory", "invalid_range")
            return self._list(path)
        lines = self._read(path).split("\n")
        start, end = args.view_range or (1, -1)
        end = len(lines) if end == -1 else end
        if not (1 <= start <= len(lines)) or not (start <= end <= len(lines)):
            raise ToolError(
                f"view_range [{start}, {end}] is outside the file's 1..{len(lines)} "
                "lines (end -1 means the last line)",
                "invalid_range",
            )
        return _numbered(lines[start - 1 : end], start)

    def _create(self, path: Path, args: CreateArgs) -> str:
        if path.is_dir():
            raise ToolError(f"{self._relative(path)} is a directory", "is_directory")
        existed = path.exists()
        if existed and not args.overwrite:
            raise ToolError(
                f"{self._relative(path)} already exists (pass overwrite to replace it)",
                "file_exists",
            )
        self._write(path, args.file_text, previous=path.read_text() if existed else None)
        return f"{'Overwrote' if existed else 'Created'} {self._relative(path)}"

    def _str_replace(self, path: Path, args: StrReplaceArgs) -> str:
        text = self._read(path)
        count = text.count(args.old_str)
        if count == 0:
            raise ToolError(f"old_str does not occur in {self._relative(path)}", "no_match")
        if count > 1:
            lines = _match_lines(text, args.old_str)
            raise ToolError(
                f"old_str occurs {count} times in {self._relative(path)} (at lines "
                f"{', '.join(map(str, lines))}); it must occur exactly once: add "
                "surrounding context",
                "multiple_matches",
            )
        new_text = text.replace(args.old_str, args.new_str, 1)
        self._write(path, new_text, previous=text)
        first = text[: text.index(args.old_str)].count("\n") + 1
        return f"Edited {self._relative(path)}:\n" + self._snippet(new_text, first, args.new_str)

    def _insert(self, path: Path, args: InsertArgs) -> str:
        text = self._read(path)
        lines = text.split("\n")
        if args.insert_line > len(lines):
            raise ToolError(
                f"insert_line {args.insert_line} is past the end of the file ({len(lines)} lines)",
                "invalid_range",
            )
        new_lines = args.new_str.split("\n")
        new_text = "\n".join(lines[: args.insert_line] + new_lines + lines[args.insert_line :])
        self._write(path, new_text, previous=text)
        return f"Inserted into {self._relative(path)}:\n" + self._snippet(
            new_text, args.insert_line + 1, args.new_str
        )

    def _undo(self, path: Path, args: UndoArgs) -> str:
        history = self._history.get(path)
        if not history:
            raise ToolError(f"no edit of {self._relative(path)} to undo", "nothing_to_undo")
        previous = history.pop()
        if previous is None:
            path.unlink(missing_ok=True)
            return f"Undid the creation of {self._relative(path)} (file removed)"
        path.write_text(previous)
        return f"Undid the last edit of {self._relative(path)}:\n" + _numbered(
            previous.split("\n"), 1
        )

    # -- helpers ---------------------------------------------------------------------------------

    def _read(self, path: Path) -> str:
        if path.is_dir():
            raise ToolError(f"{self._relative(path)} is a directory", "is_directory")
        if not path.exists():
            raise ToolError(f"{self._relative(path)} does not exist", "file_not_found")
        return path.read_text(errors="replace")

    def _write(self, path: Path, text: str, previous: str | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        history = self._history[path]
        history.append(previous)
        del history[:-UNDO_DEPTH]

    def _list(self, root: Path) -> str:
        entries = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            files = sorted(f for f in filenames if not f.startswith("."))
            entries += [self._relative(Path(dirpath, d)) + "/" for d in dirnames]
            entries += [self._relative(Path(dirpath, f)) for f in files]
            if Path(dirpath) != root:
                dirnames[:] = []  # two levels: the directory and its children
            if len(entries) > MAX_LISTED:
                break
        head = f"Files and directories up to 2 levels deep in {self._relative(root)}:\n"
        return head + "\n".join(sorted(entries)[:MAX_LISTED])

    def _relative(self, path: Path) -> str:
        relative = path.relative_to(self.workspace).as_posix()
        return "." if relative == "." else relative

    def _snippet(self, text: str, first_line: int, inserted: str) -> str:
        lines = text.split("\n")
        start = max(1, first_line - SNIPPET_LINES)
        end = min(len(lines), first_line + inserted.count("\n") + SNIPPET_LINES)
        return _numbered(lines[start - 1 : end], start)


def _numbered(lines: list[str], start: int) -> str:
    return "\n".join(f"{number:6}\t{line}" for number, line in enumerate(lines, start))


def _match_lines(text: str, needle: str) -> list[int]:
    found, position = [], text.find(needle)
    while position != -1:
        found.append(text.count("\n", 0, position) + 1)
        position = text.find(needle, position + 1)
    return found
