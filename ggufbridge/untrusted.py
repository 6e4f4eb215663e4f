"""The one reader of structured text users hand in: JSON (safetensors headers, config.json, tokenizer files,
manifest.json, eval and merge files, JSONL prompts) and TOML (hardware and quantisation recipes).

The reader bounds what a parser cannot survive, before anyone looks at a value: the document's size, its nesting
depth (Python's parsers recurse once per level: a few kilobytes of `[[[[...` end in RecursionError) and the length
of its integers (the time to read one grows with the square of its digits; Python refuses more than 4300). It does
not judge values: `"model_max_length": 1000000000000000019884624838656` (int(1e30), what transformers writes when a
tokenizer has no length limit), `1e400`, `NaN` and `Infinity` are all read, because a value nobody uses is never a
reason to refuse a file. Each value the program uses is judged where it is used, with a message naming its field
(arch.config.Cfg for config.json, checkpoint.safetensors for header offsets and shapes, ggufio.manifest, the recipe
schemas...); `finite_numbers` is the check for a consumer that uses a whole subtree of numbers. Errors are the
caller's one-line `error` (a GGUFBridgeError subclass) naming the source.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from ggufbridge.errors import GGUFBridgeError

MAX_DEPTH = 64  # deepest nesting of arrays/objects (real files: tokenizer.json ~6, configs ~4)
MAX_BYTES = 512 << 20  # tokenizer.json of a 250k vocabulary is ~12 MB; safetensors caps its header at 100 MB
MAX_INT_DIGITS = 4300  # Python's own default limit (sys.int_info.default_max_str_digits), whatever the interpreter's
MAX_ABS_FLOAT = 1e300  # for finite_numbers: far enough from the float maximum that scaling by GiB stays finite


def _int(text: str) -> int:
    """json's parse_int where the interpreter runs without its own limit (PYTHONINTMAXSTRDIGITS=0): integers up
    to MAX_INT_DIGITS digits, refused past it before int() runs. With the limit (the default), int() refuses them
    itself at C speed: a 248k-token tokenizer.json holds 248k integers."""
    if len(text) > MAX_INT_DIGITS + 1:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_int():
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    return None if 0 < limit <= MAX_INT_DIGITS else _int


def _bad_number(v, max_abs: float) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int) and not -max_abs <= v <= max_abs:
        return f"integer {str(v)[:20]}… is out of range (|x| <= {max_abs:g})"
    if isinstance(v, float) and (not math.isfinite(v) or abs(v) > max_abs):
        return f"{v!r} is not a finite number of usable size (|x| <= {max_abs:g})"
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


def _check_depth(value, source: str, error: type[GGUFBridgeError], max_depth: int) -> None:
    """Walk the parsed document without recursion: its depth only. Only containers go on the stack: a 248k-token
    tokenizer.json is ~1.2M values."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > max_depth:
            raise error(f"{source}: nested deeper than {max_depth} levels (malformed or hostile file)")
        for x in (v.values() if type(v) is dict else v if type(v) is list else ()):
            if type(x) is dict or type(x) is list:
                stack.append((x, depth + 1))


def finite_numbers(value, where: str, error: type[GGUFBridgeError], *, max_abs: float = MAX_ABS_FLOAT) -> None:
    """For a consumer that uses every number of `value` (a table it formats, sums or scales): each must be finite
    and at most `max_abs` in magnitude. `error` names `where` and the key path of the first one that is not."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif _bad_number(v, max_abs):
            at = _where(value, lambda x: _bad_number(x, max_abs))
            raise error(f"{where}{'.' + at if at and not at.startswith('[') else at}: {_bad_number(v, max_abs)}")


def parse_json(data: str | bytes, source: str, error: type[GGUFBridgeError], *, max_bytes: int = MAX_BYTES,
               max_depth: int = MAX_DEPTH):
    """Parse one JSON document from text or UTF-8 bytes, bounded; `error` naming `source` on any problem."""
    if len(data) > max_bytes:
        raise error(f"{source}: {len(data)} bytes is more than the limit of {max_bytes} for this file")
    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8")
        value = json.loads(data, parse_int=_parse_int())  # NaN, Infinity and 1e400 are read: their users judge them
    except UnicodeDecodeError as e:
        raise error(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise error(f"{source}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise error(f"{source}: nested deeper than {max_depth} levels (malformed or hostile file)") from None
    except ValueError as e:  # an integer of thousands of digits
        raise error(f"{source}: not valid JSON ({e})") from None
    _check_depth(value, source, error, max_depth)
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
    except ValueError as e:  # an integer of thousands of digits (Python's own limit)
        raise error(f"{source}: not valid TOML ({e})") from None
    _check_depth(value, source, error, max_depth)
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
