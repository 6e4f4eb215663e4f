"""A Hugging Face model folder: config, tokenizer files and the tensor index across shards."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.checkpoint.layout import canonicalize
from ggufbridge import untrusted
from ggufbridge.checkpoint.safetensors import TensorRef, read_header
from ggufbridge.errors import CheckpointError, ConfigError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_dir(spec: str | os.PathLike, *, revision: str | None = None, progress: bool = False) -> Path:
    """A local folder; a hub spec, `hf://[ORG/]NAME[@REV]` or `ms://ORG/NAME[@REV]`, downloaded into (or found in)
    that hub's cache (see checkpoint.hub); or a Hugging Face repo id already in the local HF cache (resolved
    offline). `revision` pins a hub spec or a cached repo id to a branch, tag or commit."""
    from ggufbridge.checkpoint import hub

    s = str(spec)
    hub_spec = hub.parse_spec(s)
    if hub_spec is not None:
        return hub.download(hub.pinned(hub_spec, revision), progress=progress)
    p = Path(spec).expanduser()
    if p.is_dir():
        if revision is not None:
            raise CheckpointError(f"{spec}: a local folder has no revisions (--revision is for hub specs)")
        return p
    if _REPO_ID.match(s) and not p.exists():
        snap = hub.cached_hf_snapshot(s, revision)
        if snap is None:
            at = f" at revision {revision}" if revision else ""
            raise CheckpointError(f"{s}: not a folder, and no snapshot of that repo id{at} in the HF cache at "
                                  f"{hub.hf_cache_dir()} (hf://{s} downloads it)")
        return snap
    if p.exists():
        raise CheckpointError(f"{spec}: expected a model folder, found a file")
    raise CheckpointError(f"{spec}: no such model folder")


def load_json(path: Path, what: str) -> dict:
    if not path.exists():
        raise ConfigError(f"{path.parent.name}: missing {path.name} ({what})")
    data = untrusted.load_json(path, ConfigError, max_bytes=64 << 20, what=what)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


@dataclass
class ModelDir:
    path: Path
    config: dict
    tensors: dict[str, TensorRef] = field(repr=False)  # by canonical name (see checkpoint.layout); refs keep theirs
    shards: list[Path] = field(repr=False)
    layout: str = "transformers"  # the name layout the shards were found in (checkpoint.layout.LAYOUTS)

    @classmethod
    def open(cls, spec: str | os.PathLike) -> "ModelDir":
        path = resolve_model_dir(spec)
        if not any(path.iterdir()):
            raise CheckpointError(f"{path}: the folder is empty (expected config.json and safetensors shards)")
        config = load_json(path / "config.json", "the model configuration")
        tensors, shards = index_tensors(path)
        layout, tensors = canonicalize(tensors, path)
        return cls(path, config, tensors, shards, layout.name)

    def file(self, name: str) -> Path | None:
        p = self.path / name
        return p if p.is_file() else None

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def index_tensors(path: Path) -> tuple[dict[str, TensorRef], list[Path]]:
    """Map every tensor name to its shard, checking the index against the shards' own headers."""
    index_file = path / INDEX_NAME
    if index_file.is_file():
        index = load_json(index_file, "the shard index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_file}: no weight_map")
        for s in weight_map.values():
            if not isinstance(s, str) or "/" in s or "\\" in s or s.startswith("."):
                raise CheckpointError(f"{index_file}: shard name {str(s)[:60]!r} is not a plain file name")
        shard_names = sorted(set(weight_map.values()))
        missing = [s for s in shard_names if not (path / s).is_file()]
        if missing:
            raise CheckpointError(f"{path}: the index names missing shard file(s): {', '.join(missing)}")
    elif (path / SINGLE_NAME).is_file():
        weight_map = None
        shard_names = [SINGLE_NAME]
    else:
        raise CheckpointError(f"{path}: no {INDEX_NAME} or {SINGLE_NAME} found")

    tensors: dict[str, TensorRef] = {}
    for s in shard_names:
        found, _ = read_header(path / s)
        for name, ref in found.items():
            if name in tensors:
                raise CheckpointError(f"{path}: tensor {name} is stored twice ({tensors[name].path.name} and {s})")
            tensors[name] = ref
    if weight_map is not None:
        for name, shard in weight_map.items():
            ref = tensors.get(name)
            if ref is None:
                raise CheckpointError(f"{path}: the index puts {name} in {shard}, but {shard} does not contain it")
            if ref.path.name != shard:
                raise CheckpointError(f"{path}: the index puts {name} in {shard}, but it is in {ref.path.name}")
        extra = sorted(set(tensors) - set(weight_map))
        if extra:
            raise CheckpointError(f"{path}: {len(extra)} tensor(s) in the shards are not in the index, e.g. {extra[0]}")
    return tensors, [path / s for s in shard_names]
