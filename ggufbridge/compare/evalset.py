"""Eval rows: token id sequences with a kind, read from JSONL or cut from a text file, plus their hashes.

JSONL rows are `{"ids": [...]}` (used as given) or `{"text": "..."}` (tokenised by the caller's tokenizer,
without BOS), each with an optional `"kind"` (default "default"). `--text FILE` cuts the file's tokens into
consecutive rows of `ctx` tokens (a shorter remainder of at least 2 tokens becomes the last row), kind = the
file's stem.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufbridge.errors import EvalDataError
from ggufbridge.units import INT32_MAX
from ggufbridge.textfile import read_utf8
from ggufbridge.untrusted import parse_json

DEFAULT_KIND = "default"
Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class Row:
    ids: tuple[int, ...]
    kind: str = DEFAULT_KIND
    text: str | None = None  # kept so that every tokenizer involved can be checked against the ids

    @property
    def labels(self) -> np.ndarray:
        """Next token of each position; -1 at the last position (it has none)."""
        return np.array(self.ids[1:] + (-1,), dtype=np.int64)

    @property
    def sha256(self) -> str:
        return row_hash(self.ids)


def row_hash(ids) -> str:
    """sha256 of the ids as little-endian int32: the identity of a row in a logits dump."""
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def set_hash(rows: list[Row]) -> str:
    """sha256 over the rows' hashes in order: the identity of an eval set."""
    h = hashlib.sha256()
    for r in rows:
        h.update(r.sha256.encode())
    return h.hexdigest()


def _parse_jsonl(path: Path) -> list[dict]:
    out = []
    # split on "\n" only: str.splitlines would also cut at a U+2028 inside a JSON string
    for lineno, line in enumerate(read_utf8(path, EvalDataError).split("\n"), start=1):
        if not line.strip():
            continue
        obj = parse_json(line, f"{path}:{lineno}", EvalDataError)
        if not isinstance(obj, dict) or ("ids" in obj) == ("text" in obj):
            raise EvalDataError(f"{path}:{lineno}: expected an object with exactly one of 'ids' or 'text'")
        kind = obj.get("kind", DEFAULT_KIND)
        if not isinstance(kind, str) or not kind:
            raise EvalDataError(f"{path}:{lineno}: 'kind' must be a non-empty string, found {kind!r}")
        if "ids" in obj:
            ids = obj["ids"]
            if (not isinstance(ids, list) or
                    not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= INT32_MAX for i in ids)):
                # ids are hashed and fed to the models as int32 (row_hash)
                raise EvalDataError(f"{path}:{lineno}: 'ids' must be a list of non-negative integers of at most "
                                    f"{INT32_MAX} (token ids)")
        elif not isinstance(obj["text"], str):
            raise EvalDataError(f"{path}:{lineno}: 'text' must be a string, found {type(obj['text']).__name__}")
        out.append({**obj, "kind": kind, "line": lineno})
    return out


def needs_tokenizer(eval_path=None, text_path=None) -> bool:
    """Whether the eval set has text to tokenise (False when nothing is given: load_rows reports that)."""
    if text_path is not None:
        return True
    if eval_path is None:
        return False
    return any("text" in r for r in _parse_jsonl(Path(eval_path)))


def load_rows(*, eval_path=None, text_path=None, ctx: int, tokenize: Tokenize | None) -> list[Row]:
    """Read an eval set. Exactly one of `eval_path` (JSONL) and `text_path` must be given."""
    if (eval_path is None) == (text_path is None):
        raise EvalDataError("give exactly one of --eval FILE.jsonl and --text FILE")
    if ctx < 2:
        raise EvalDataError(f"--ctx must be at least 2, found {ctx}")
    rows: list[Row] = []
    if text_path is not None:
        path = Path(text_path)
        text = read_utf8(path, EvalDataError)
        if tokenize is None:
            raise EvalDataError("--text needs a tokenizer, and no source given has one")
        ids = list(tokenize(text))
        for a in range(0, len(ids), ctx):
            piece = tuple(ids[a:a + ctx])
            if len(piece) >= 2:
                rows.append(Row(piece, kind=path.stem))
        if not rows:
            raise EvalDataError(f"{path}: empty eval set ({len(ids)} tokens; need at least 2)")
        return rows
    path = Path(eval_path)
    for obj in _parse_jsonl(path):
        if "text" in obj:
            if tokenize is None:
                raise EvalDataError(f"{path}:{obj['line']}: a 'text' row needs a tokenizer, and no source has one")
            ids, text = tuple(tokenize(obj["text"])), obj["text"]
        else:
            ids, text = tuple(obj["ids"]), None
        if not ids:
            raise EvalDataError(f"{path}:{obj['line']}: row has no tokens")
        if len(ids) > ctx:
            raise EvalDataError(f"{path}:{obj['line']}: row has {len(ids)} tokens, more than --ctx {ctx}")
        rows.append(Row(ids, kind=obj["kind"], text=text))
    if not rows:
        raise EvalDataError(f"{path}: empty eval set (no rows)")
    return rows


def check_ids_fit(rows: list[Row], vocab_size: int, who: str) -> None:
    for i, r in enumerate(rows):
        top = max(r.ids)
        if top >= vocab_size:
            raise EvalDataError(f"row {i}: token id {top} is outside {who}'s vocabulary of {vocab_size}")


def write_rows(rows: list[Row], path) -> None:
    """The rows as `{"ids": [...], "kind": ...}` JSONL: another machine then evaluates exactly these token ids."""
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"ids": list(r.ids), "kind": r.kind}) + "\n")
