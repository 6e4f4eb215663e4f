"""Text files users hand in (recipes, eval sets, templates): read as UTF-8, and a file that is not is one line."""

from __future__ import annotations

from pathlib import Path

from ggufbridge.errors import GGUFBridgeError


def read_utf8(path, error: type[GGUFBridgeError]) -> str:
    """The file's text; `error` naming the file and the first bad byte when it is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
