"""Hardware recipes: TOML data files (ggufbridge/recipes/*.toml, or a user file by path) validated into a Recipe.

A user file may start from a packaged recipe with `base = "NAME"` and override only some keys.
Every value is checked here, before anything is planned or launched; messages name the key, the expected
and the found value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ggufbridge.errors import RecipeError
from ggufbridge.units import INT32_MAX
from ggufbridge import textfile

# KV cache element types the runtime accepts for -ctk/-ctv (common/arg.cpp, kv_cache_types)
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def kv_block(type_name: str) -> tuple[int, int]:
    """(elements, bytes) of one block of a KV cache type, from gguf-py's table of GGML types."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]]

FLASH_ATTN = ("on", "off", "auto")
BACKENDS = ("cpu", "cuda", "metal", "vulkan", "hip", "sycl")
MAX_DRAFT_N = 15  # DSpark block length upstream is 16 with the anchor slot; the EXL3 recipes draft at most 15
# memory sizes: a recipe describes one machine; 1 PiB in any field is a typo or hostile, and keeps byte counts exact
MAX_GIB = float(1 << 20)
MAX_THREADS = 4096  # more than any machine's cores; llama.cpp sizes per-thread buffers from it




def _int(lo=None, hi=INT32_MAX):
    def check(key, v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise RecipeError(f"{key}: expected an integer, found {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise RecipeError(f"{key}: expected an integer in [{lo}, {hi if hi is not None else '∞'}], "
                              f"found {str(v)[:40]}")
        return v
    return check


def _num(lo=0.0, hi=MAX_GIB):
    def check(key, v):
        # an integer of hundreds of digits is no float: compare before math.isfinite converts it
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, int) and abs(v) > 2**64)
                or not math.isfinite(v) or v < lo):
            raise RecipeError(f"{key}: expected a number >= {lo}, found {str(v)[:40]}")
        if hi is not None and v > hi:
            raise RecipeError(f"{key}: expected a number in [{lo}, {hi}], found {v!r}")
        return float(v)
    return check


def _bool(key, v):
    if not isinstance(v, bool):
        raise RecipeError(f"{key}: expected true or false, found {v!r}")
    return v


def _str(key, v):
    if not isinstance(v, str):
        raise RecipeError(f"{key}: expected a string, found {v!r}")
    return v


def _choice(options):
    def check(key, v):
        if v not in options:
            raise RecipeError(f"{key}: expected one of {', '.join(map(str, options))}, found {v!r}")
        return v
    return check


def _layers(key, v):
    """A layer count, "all", or "auto" (the planner picks)."""
    if v in ("all", "auto"):
        return v
    return _int(0)(key, v)


def _gib_list(key, v):
    if not isinstance(v, list):
        raise RecipeError(f"{key}: expected a list of GiB sizes, found {v!r}")
    return [_num(0.5)(f"{key}[{i}]", x) for i, x in enumerate(v)]


# section -> key -> (validator, default); a default of `...` means required
SCHEMA = {
    "": {
        "name": (_str, ...), "description": (_str, ""), "backend": (_choice(BACKENDS), ...),
        "quant": (_str, ""), "base": (_str, None),
    },
    "memory": {
        "unified": (_bool, False), "gpu_gib": (_gib_list, []), "host_gib": (_num(), 0.0),
        "headroom_gib": (_num(), 0.0), "host_headroom_gib": (_num(), 0.0),
        # measured compute model (runtime/memory.py); compute_mib is a fixed reserve per pool on top of it, or in its
        # place (default 1024) for a recipe without compute_token_kib
        "compute_mib": (_num(), None), "compute_token_kib": (_num(), None), "context_mib": (_num(), 0.0),
    },
    "server": {
        "ctx": (_int(256), ...), "min_ctx": (_int(256), None), "parallel": (_int(1, 256), 1),
        "batch": (_int(1), 2048), "ubatch": (_int(1), 512), "flash_attn": (_choice(FLASH_ATTN), "auto"),
        "cache_type_k": (_choice(KV_TYPES), "f16"), "cache_type_v": (_choice(KV_TYPES), "f16"),
        "n_gpu_layers": (_layers, "auto"), "n_cpu_moe": (_layers, 0), "mmproj_offload": (_bool, True),
        "threads": (_int(1, MAX_THREADS), None), "extra_args": (None, []),
        # each slot's sampler chain in the decode graph (llama-server --backend-sampling) instead of on the server
        # thread after every decode; a request that needs what the graph cannot do (grammar, a reasoning budget,
        # pre-sampling probabilities) samples on the host as before (docs/benchmarks.md, "Many clients at once")
        "backend_sampling": (_bool, False),
        # thinking off unless asked, as upstream's recommended serving ({"enable_thinking": false})
        "think": (_bool, False), "reasoning_budget": (_int(-1), -1),
    },
    "draft": {
        "ctx_cap": (_int(256), 8192), "n_max": (_int(1, MAX_DRAFT_N), 8), "n_min": (_int(0), 0),
        "p_min": (_num(0.0, 1.0), 0.0), "n_gpu_layers": (_layers, "all"),
        "cache_type_k": (_choice(KV_TYPES), "f16"), "cache_type_v": (_choice(KV_TYPES), "f16"),
    },
    "rpc": {
        "workers": (_int(0, 16), 0), "worker_gib": (_num(), 0.0), "worker_headroom_gib": (_num(), 0.0),
        "default_port": (_int(1, 65535), 50052),
    },
}


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    backend: str
    quant: str
    memory: dict
    server: dict
    draft: dict
    rpc: dict
    source: str  # "packaged" or the user file path

    @property
    def uses_gpu(self) -> bool:
        return self.backend != "cpu"


def packaged_names() -> list[str]:
    return textfile.packaged_names(_folder())


def _folder():
    return resources.files("ggufbridge").joinpath("recipes")


def load_recipe(name_or_path: str) -> Recipe:
    """A packaged recipe by name, or a user TOML file by path (optionally `base = "NAME"` + overrides)."""
    raw, source, _ = textfile.load_toml(name_or_path, _folder(), "recipe", RecipeError)
    return _validate(raw, source)


def _validate(raw: dict, source: str) -> Recipe:
    out = {}
    for section, keys in SCHEMA.items():
        table = raw if section == "" else raw.get(section, {})
        if not isinstance(table, dict):
            raise RecipeError(f"[{section}]: expected a table, found {table!r}")
        known = set(keys) | (set(SCHEMA) - {""} if section == "" else set())
        unknown = sorted(set(table) - known)
        if unknown:
            raise RecipeError(f"[{section or 'top level'}]: unknown key(s) {', '.join(unknown)}; "
                              f"expected some of {', '.join(sorted(keys))}")
        vals = {}
        for key, (check, default) in keys.items():
            label = f"{section}.{key}" if section else key
            if key in table:
                v = table[key]
                vals[key] = check(label, v) if check else v
            elif default is ...:
                raise RecipeError(f"{label}: required key missing in recipe {source}")
            else:
                vals[key] = list(default) if isinstance(default, list) else default
        out[section] = vals
    srv, drf, mem = out["server"], out["draft"], out["memory"]
    if srv["min_ctx"] is None:
        srv["min_ctx"] = srv["ctx"]
    if srv["min_ctx"] > srv["ctx"]:
        raise RecipeError(f"server.min_ctx: expected <= server.ctx ({srv['ctx']}), found {srv['min_ctx']}")
    if srv["ubatch"] > srv["batch"]:
        raise RecipeError(f"server.ubatch: expected <= server.batch ({srv['batch']}), found {srv['ubatch']}")
    if not isinstance(srv["extra_args"], list) or not all(isinstance(a, str) for a in srv["extra_args"]):
        raise RecipeError(f"server.extra_args: expected a list of strings, found {srv['extra_args']!r}")
    for sec, label in ((srv, "server"), (drf, "draft")):
        # the runtime refuses a quantised V cache without flash attention (llama-context.cpp)
        fa = srv["flash_attn"]
        if kv_block(sec["cache_type_v"])[0] > 1 and fa == "off":
            raise RecipeError(f"{label}.cache_type_v: {sec['cache_type_v']} needs flash attention, "
                              f"found server.flash_attn = 'off'")
    if drf["n_min"] > drf["n_max"]:
        raise RecipeError(f"draft.n_min: expected <= draft.n_max ({drf['n_max']}), found {drf['n_min']}")
    top = out[""]
    if top["backend"] == "cpu" and mem["gpu_gib"]:
        raise RecipeError(f"memory.gpu_gib: a cpu recipe has no GPUs, found {mem['gpu_gib']}")
    if top["backend"] != "cpu" and not mem["gpu_gib"] and not out["rpc"]["workers"]:
        raise RecipeError(f"memory.gpu_gib: backend {top['backend']} needs at least one GPU size, found []")
    if mem["unified"] and len(mem["gpu_gib"]) != 1:
        raise RecipeError(f"memory.gpu_gib: a unified-memory recipe has exactly one pool, found {mem['gpu_gib']}")
    if not mem["unified"] and mem["host_gib"] <= 0:
        raise RecipeError(f"memory.host_gib: expected the RAM size in GiB (> 0), found {mem['host_gib']}")
    if out["rpc"]["workers"] and out["rpc"]["worker_gib"] <= 0:
        raise RecipeError(f"rpc.worker_gib: expected each worker's memory in GiB (> 0), "
                          f"found {out['rpc']['worker_gib']}")
    return Recipe(name=top["name"], description=top["description"], backend=top["backend"], quant=top["quant"],
                  memory=mem, server=srv, draft=drf, rpc=out["rpc"], source=source)
