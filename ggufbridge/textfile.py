"""Text files users hand in (recipes, eval sets, templates): read as UTF-8, and a file that is not is one line;
recipes (TOML) through one loader."""

from __future__ import annotations

from importlib.resources.abc import Traversable
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package (declared in pyproject.toml)
    import tomli as tomllib  # type: ignore[no-redef]

from ggufbridge.errors import GGUFBridgeError


def read_utf8(path, error: type[GGUFBridgeError]) -> str:
    """The file's text; `error` naming the file and the first bad byte when it is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def packaged_names(folder: Traversable) -> list[str]:
    """The names (file stems) of the .toml files in a packaged folder."""
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_toml(name_or_path: str, folder: Traversable, kind: str,
              error: type[GGUFBridgeError]) -> tuple[dict, str, str]:
    """(table, source, name) of a recipe: a packaged one by NAME (NAME.toml in `folder`; source "packaged"), or a
    user's TOML file by path (source: the path; name: its stem).

    The one loader of both kinds of recipe (hardware recipes, quantisation mixes; `kind` says which in messages),
    with one rule for `base = "NAME"` in a user's file: start from that packaged recipe, then override key by key,
    tables merged recursively (so `[server] ctx = 4096` changes one key of [server], `[types] attention = "Q8_0"`
    one class of [types]). A packaged recipe has no base."""
    raw, source, name = _read_toml(name_or_path, folder, kind, error)
    if "base" not in raw:
        return raw, source, name
    base, known = raw["base"], packaged_names(folder)
    if source == "packaged" or not isinstance(base, str) or base not in known:
        raise error(f"{kind} {name}: base: expected one of {', '.join(known)}, found {base!r}")
    return _merge(_read_toml(base, folder, kind, error)[0], raw), source, name


def _read_toml(name_or_path: str, folder: Traversable, kind: str,
               error: type[GGUFBridgeError]) -> tuple[dict, str, str]:
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise error(f"{kind} file {path} does not exist")
        text, source, name = read_utf8(path, error), str(path), path.stem
    else:
        res = folder.joinpath(f"{name_or_path}.toml")
        if not res.is_file():
            raise error(f"unknown {kind} {name_or_path!r}: expected one of {', '.join(packaged_names(folder))} "
                        f"or a path to a .toml file")
        text, source, name = res.read_text(), "packaged", name_or_path
    try:
        return tomllib.loads(text), source, name
    except tomllib.TOMLDecodeError as e:
        raise error(f"{kind} {name_or_path}: not valid TOML ({e})") from None


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out
