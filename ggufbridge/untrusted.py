"""The one reader of structured text users hand in: JSON (safetensors headers, config.json, tokenizer files,
manifest.json, eval and merge files, JSONL prompts) and TOML (hardware and quantisation recipes).

Every document is bounded before anyone looks at its values: its size, its nesting depth and its numbers. Python's
parsers recurse once per level (a few kilobytes of `[[[[...` end in RecursionError), take integers of any length
(thousands of digits end in ValueError, or are kept and overflow later) and read `1e400`, `NaN` and `Infinity` as
floats that then poison arithmetic (`int(1e308 * 2**30)` is an OverflowError). Here all of that is the caller's
one-line error instead: `error` (a GGUFBridgeError subclass) naming the source.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from ggufbridge.errors import GGUFBridgeError

MAX_DEPTH = 64  # deepest nesting of arrays/objects (real files: tokenizer.json ~6, configs ~4)
MAX_BYTES = 512 << 20  # tokenizer.json of a 250k vocabulary is ~12 MB; safetensors caps its header at 100 MB
INT_LIMIT = 2**64  # integers must lie in (-2**64, 2**64): u64 offsets and sizes, never more
MAX_ABS_FLOAT = 1e300  # finite, and far enough from the float maximum that scaling by GiB stays finite


def _bad_number(v) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and not -INT_LIMIT < v < INT_LIMIT:
        return f"integer {str(v)[:20]}… is out of range (at most 2^64 in magnitude)"
    if isinstance(v, float) and (not math.isfinite(v) or abs(v) > MAX_ABS_FLOAT):
        return f"{v!r} is not a finite number of usable size (|x| <= {MAX_ABS_FLOAT:g})"
    return None


def _where(root, bad) -> str:
    """The key path of the first value `bad` finds (only on the error path: the walk itself keeps no paths)."""
    stack = [(root, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}" if path else str(k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
        elif bad(v):
            return path
    return ""


def _check_values(value, source: str, error: type[GGUFBridgeError], max_depth: int) -> None:
    """Walk the parsed document without recursion: depth, integer range and float finiteness. Only containers go
    on the stack and strings are skipped by exact type: a 248k-token tokenizer.json is ~1.2M values."""
    stack = [([value], 0)]  # the document inside a list of depth 0: its own depth is 1
    while stack:
        v, depth = stack.pop()
        if depth > max_depth:
            raise error(f"{source}: nested deeper than {max_depth} levels (malformed or hostile file)")
        for x in (v.values() if type(v) is dict else v):
            t = type(x)
            if t is str:
                continue
            if t is dict or t is list:
                stack.append((x, depth + 1))
            elif (t is int and -INT_LIMIT < x < INT_LIMIT) or (t is float and -MAX_ABS_FLOAT <= x <= MAX_ABS_FLOAT):
                continue  # the common case, decided without a call (NaN fails both comparisons)
            elif _bad_number(x):
                where = _where(value, _bad_number)
                raise error(f"{source}: {where + ': ' if where else ''}{_bad_number(x)}")


def parse_json(data: str | bytes, source: str, error: type[GGUFBridgeError], *, max_bytes: int = MAX_BYTES,
               max_depth: int = MAX_DEPTH):
    """Parse one JSON document from text or UTF-8 bytes, bounded; `error` naming `source` on any problem."""
    if len(data) > max_bytes:
        raise error(f"{source}: {len(data)} bytes is more than the limit of {max_bytes} for this file")
    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8")
        value = json.loads(data)  # NaN/Infinity parse, and are refused by the walk, which names their key
    except UnicodeDecodeError as e:
        raise error(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise error(f"{source}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise error(f"{source}: nested deeper than {max_depth} levels (malformed or hostile file)") from None
    except ValueError as e:  # an integer of thousands of digits
        raise error(f"{source}: not valid JSON ({e})") from None
    _check_values(value, source, error, max_depth)
    return value


def parse_toml(text: str, source: str, error: type[GGUFBridgeError], *, max_bytes: int = 1 << 20,
               max_depth: int = MAX_DEPTH) -> dict:
    """Parse one TOML document, bounded (recipes are a few hundred bytes; 1 MB is generous)."""
    if len(text) > max_bytes:
        raise error(f"{source}: {len(text)} characters is more than the limit of {max_bytes} for a recipe")
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{source}: not valid TOML ({e})") from None
    except RecursionError:
        raise error(f"{source}: nested deeper than {max_depth} levels (malformed or hostile file)") from None
    except ValueError as e:  # an integer of thousands of digits
        raise error(f"{source}: not valid TOML ({e})") from None
    _check_values(value, source, error, max_depth)
    return value


def read_bytes(path, error: type[GGUFBridgeError], max_bytes: int, what: str = "file") -> bytes:
    """A file's bytes, refused before reading when it is larger than `max_bytes`."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise error(f"{p}: {size} bytes is more than the limit of {max_bytes} for a {what}")
        return p.read_bytes()
    except FileNotFoundError:
        raise error(f"{p}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{p}: expected a {what}, found a folder") from None
    except OSError as e:
        raise error(f"cannot read {p}: {e.strerror or e}") from None


def load_json(path, error: type[GGUFBridgeError], *, max_bytes: int = MAX_BYTES, what: str = "JSON file"):
    """Read and parse a JSON file, bounded."""
    return parse_json(read_bytes(path, error, max_bytes, what), str(path), error, max_bytes=max_bytes)


def load_toml(path, error: type[GGUFBridgeError], *, max_bytes: int = 1 << 20, what: str = "TOML file") -> dict:
    raw = read_bytes(path, error, max_bytes, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return parse_toml(text, str(path), error, max_bytes=max_bytes)
