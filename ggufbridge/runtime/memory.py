"""Memory planner: what a recipe's settings cost on each device, computed from GGUF headers (or hparams).

Model of the pinned runtime (llama.cpp 0c1e57098), each rule with its source:
* KV cache: only full-attention layers hold K/V (`filter_attn`, src/llama-model.cpp:2698-2704); per token and
  layer `n_head_kv·key_length` K elements + `n_head_kv·value_length` V elements of -ctk/-ctv type; the cell
  count is `-c` padded to 256 (src/llama-context.cpp:290).
* Gated-delta-net state, per slot and per recurrent layer, independent of context: conv state
  `(conv_kernel-1)·(inner_size + 2·group_count·state_size)` and delta state `state_size·inner_size` elements,
  both F32 (src/llama-model.cpp:2756-2773; src/llama-hparams.cpp:208-258), times `1 + n_rs_seq` rows, where
  n_rs_seq = --spec-draft-n-max when a DSpark draft is attached (src/llama-memory-recurrent.cpp:101).
* Slots (-np N, issue 28): each slot gets the recipe's context and its own recurrent state; the KV cache is one
  unified pool of N x context cells (`-c N*ctx --kv-unified --kv-unified-per-slot ctx`), which costs the same bytes
  as N separate streams (src/llama-kv-cache.cpp:233-234: a non-unified cache is `kv_size = n_ctx/N` cells times N
  streams; src/llama-context.cpp:292-306) but lets one ubatch carry any set of busy slots: the hybrid memory splits
  a batch with split_equal(sequential = !unified) (src/llama-memory-hybrid.cpp:81-89), and a sequential split takes
  only consecutive sequence ids (src/llama-batch.cpp:570-572), so separate streams decode busy slots {0, 2, 3} in
  two graph passes. --kv-unified-per-slot caps each slot at its context (tools/server/server-context.cpp:4008-4016),
  so no slot can take another's share of the pool. The draft context copies n_ctx, n_seq_max and kv_unified from
  the target (common/speculative.cpp:2518-2531): its KV is a pool of the same cells.
* Context checkpoints (host memory): llama-server keeps up to 32 (`--ctx-checkpoints`, common/common.h:631) copies
  of each slot's recurrent state in host RAM (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the recurrent part only,
  src/llama-memory-hybrid.cpp:190-195; tools/server/server-context.cpp:2290-2351); budgeted in full per slot.
* Compute buffers (measured: docs/benchmarks.md, "Compute buffers"): per device that runs layers,
  `ubatch · compute_token_kib` (the graph's activations, linear in -ub; the recipe's figure, measured at the real
  shape for its backend) + `2 · ubatch · cells` (the F16 attention mask of flash attention) + for a quantised KV cache
  on a GPU `cells · n_head_kv · (key_length + value_length) · 2` (one layer's K and V converted to F16) + the largest
  routed-expert tensor left in host memory by --n-cpu-moe (copied to the GPU for each batch); on the host of a GPU
  run, `ubatch · (2 · cells + 8 · n_embd)` (the mask and inputs staged in pinned memory); plus `context_mib` per GPU
  (CUDA context and library workspaces: the memory llama-server lists as "unaccounted"; an RPC worker has one too).
  Several slots add `2 · slots · (1 + n_rs_seq)` copies of one recurrent layer's state (the reserved graph gathers
  every slot's state and snapshots; measured on CPU at the real recurrent shapes, tests/test_plan_runtime.py: the
  runtime's growth from one slot stays under it), and the draft's compute buffer is its own mask,
  `2 · ubatch · cells`. With a draft, the target's output buffer (host memory, pinned on a GPU: src/llama-context.cpp:
  2194-2200) keeps the inputs of the draft's target layers for -b tokens: `4 · n_embd · batch · target_layers`.
* -ngl N offloads the last N blocks, the output head too when N > n_layer; token_embd stays on the host;
  --n-cpu-moe N keeps the routed experts of blocks 0..N-1 in host memory; RPC devices come first in the device
  list (src/llama.cpp:275) and layers are split over devices in order, proportionally to --tensor-split.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import PlanError
from ggufbridge.runtime.pairing import draft_value
from ggufbridge.runtime.recipes import Recipe, kv_block

GIB = 1024**3
MIB = 1024**2
KV_PAD = 256
CTX_CHECKPOINTS = 32  # llama-server's --ctx-checkpoints default: recurrent-state copies per slot in host RAM
# -b with several slots: at least SLOT_BATCH prompt tokens per slot, up to SLOTS_BATCH_MAX. llama-server fills each
# iteration's batch with the decoding slots' tokens and then pending prompt tokens up to -b (tools/server/
# server-context.cpp:3082-3094, 3505), so with -b 2048 eight prompts arriving together take four iterations and the
# first ones' streams decode one token per iteration while the rest prefill. Measured on the H200 (docs/benchmarks.md,
# "The 22-patch series and the slots' batch"): 8 streams of 1k-token prompts, sum of per-stream decode rates 2.96x
# one stream at -b 2048, 3.69x at -b 8192, TTFT p50 unchanged (3.40 / 3.34 s). The cap bounds how long one long
# prompt's iteration holds up the decoding slots (a whole iteration's prompt tokens are prefilled before their next
# token).
# Memory: the compute buffers follow -ub, not -b (src/llama-context.cpp:629, 674: graph_reserve of n_ubatch tokens).
SLOT_BATCH = 1024
SLOTS_BATCH_MAX = 8192

EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_(ch)?exps\.")
BLOCK_RE = re.compile(r"^blk\.(\d+)\.")


def served_batch(batch: int, slots: int) -> int:
    """llama-server's -b for the recipe's `batch`: as it is with one slot; with several, room for SLOT_BATCH prompt
    tokens per slot, capped at SLOTS_BATCH_MAX (why: above)."""
    return batch if slots == 1 else max(batch, min(SLOTS_BATCH_MAX, slots * SLOT_BATCH))


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of a row of n elements (ggml_row_size); n must be a multiple of the block size."""
    blk, size = kv_block(type_name)
    if n % blk:
        raise PlanError(f"KV cache type {type_name} needs rows divisible by {blk}, found a row of {n} "
                        f"(head_dim x heads); choose f16/bf16/f32")
    return n // blk * size


@dataclass(frozen=True)
class TargetShape:
    """What the planner needs to know about a qwen35moe target."""

    n_layer: int
    recurrent: tuple[bool, ...]
    n_head_kv: tuple[int, ...]
    key_length: int
    value_length: int
    conv_kernel: int
    state_size: int
    group_count: int
    inner_size: int
    n_vocab: int = 0
    n_ctx_train: int = 0                # context_length of the GGUF (0 = unknown)
    block_bytes: tuple[int, ...] = ()   # non-expert weight bytes per block
    expert_bytes: tuple[int, ...] = ()  # routed-expert weight bytes per block
    input_bytes: int = 0                # token_embd (always host)
    output_bytes: int = 0               # output head + final norm
    n_embd: int = 0
    expert_max_bytes: tuple[int, ...] = ()  # largest single routed-expert tensor per block

    def with_tensor_bytes(self, tensors: Iterable[tuple[str, int]]) -> "TargetShape":
        """This shape with its weight bytes from (GGUF tensor name, bytes) pairs: per block the routed experts
        apart from the rest (and the largest expert tensor), token_embd as input, everything else as output.
        Blocks past n_layer (MTP, loaded with the last layer's device) are counted in the last block."""
        n = self.n_layer
        block, experts, emax = [0] * n, [0] * n, [0] * n
        inp = out = 0
        for name, nbytes in tensors:
            m = EXPERT_RE.match(name) or BLOCK_RE.match(name)
            if m is None:
                if name.startswith("token_embd."):
                    inp += nbytes
                else:
                    out += nbytes
                continue
            il = int(m.group(1))
            if m.re is EXPERT_RE:
                experts[min(il, n - 1)] += nbytes
                if il < n:
                    emax[il] = max(emax[il], nbytes)
            else:
                block[min(il, n - 1)] += nbytes
        return dataclasses.replace(self, block_bytes=tuple(block), expert_bytes=tuple(experts),
                                   expert_max_bytes=tuple(emax), input_bytes=inp, output_bytes=out)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.n_layer) if not self.recurrent[i]]

    @property
    def recurrent_layers(self) -> list[int]:
        return [i for i in range(self.n_layer) if self.recurrent[i]]

    def kv_layer_bytes_per_token(self, il: int, type_k: str = "f16", type_v: str = "f16") -> int:
        if self.recurrent[il]:
            return 0
        h = self.n_head_kv[il]
        for t, d in ((type_k, self.key_length), (type_v, self.value_length)):
            blk = kv_block(t)[0]
            if d % blk:  # the runtime refuses a quantised cache whose head_dim is not whole blocks
                raise PlanError(f"KV cache type {t} needs head_dim divisible by {blk}, found {d}; "
                                f"use f16/bf16/f32")
        return row_bytes(type_k, h * self.key_length) + row_bytes(type_v, h * self.value_length)

    def kv_bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> int:
        return sum(self.kv_layer_bytes_per_token(i, type_k, type_v) for i in range(self.n_layer))

    def conv_state_elems(self) -> int:
        return (self.conv_kernel - 1) * (self.inner_size + 2 * self.group_count * self.state_size)

    def delta_state_elems(self) -> int:
        return self.state_size * self.inner_size

    def state_layer_bytes(self, conv_elem: int = 4, delta_elem: int = 4) -> int:
        return self.conv_state_elems() * conv_elem + self.delta_state_elems() * delta_elem

    def state_bytes_per_slot(self, conv_elem: int = 4, delta_elem: int = 4) -> int:
        """Recurrent state of one sequence (one snapshot), all recurrent layers. The runtime stores F32."""
        return len(self.recurrent_layers) * self.state_layer_bytes(conv_elem, delta_elem)

    @property
    def weight_bytes(self) -> int:
        return sum(self.block_bytes) + sum(self.expert_bytes) + self.input_bytes + self.output_bytes

    @classmethod
    def from_config(cls, cfg: dict) -> "TargetShape":
        """From a Hugging Face Qwen3.5-MoE text config (the real model's numbers, or a fixture's)."""
        n = cfg["num_hidden_layers"]
        types = cfg.get("layer_types")
        if types is None:
            interval = cfg.get("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
        if len(types) != n:
            raise PlanError(f"layer_types: expected {n} entries (num_hidden_layers), found {len(types)}")
        if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
            raise PlanError("linear_key_head_dim must equal linear_value_head_dim for this runtime, found "
                            f"{cfg['linear_key_head_dim']} and {cfg['linear_value_head_dim']}")
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return cls(
            n_layer=n, recurrent=tuple(t == "linear_attention" for t in types),
            n_head_kv=(cfg["num_key_value_heads"],) * n, key_length=hd, value_length=hd,
            conv_kernel=cfg["linear_conv_kernel_dim"], state_size=cfg["linear_key_head_dim"],
            group_count=cfg["linear_num_key_heads"],
            inner_size=cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"],
            n_vocab=cfg.get("vocab_size", 0), n_ctx_train=cfg.get("max_position_embeddings", 0),
            n_embd=cfg["hidden_size"])


@dataclass(frozen=True)
class DraftShape:
    """A DFlash/DSpark draft: dense attention layers, every one with a KV cache."""

    n_layer: int
    n_head_kv: int
    key_length: int
    value_length: int
    weight_bytes: int = 0
    block_size: int | None = None
    target_layers: int = 0  # target layers whose inputs the draft reads (its `target_layers` key)

    def kv_bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> int:
        return self.n_layer * (row_bytes(type_k, self.n_head_kv * self.key_length)
                               + row_bytes(type_v, self.n_head_kv * self.value_length))


# ------------------------------------------------------------------------------------------ GGUF headers


def _gguf_fields(path: Path, parts: tuple[Path, ...] = ()):
    """Metadata and (name, bytes) of every tensor, from the bounded header reader: it parses the 248k-entry
    vocabulary arrays in a fraction of the time gguf's GGUFReader takes (which builds a numpy view per element).
    A split model (`parts`, the first being `path`): the metadata of the first part, the tensors of all."""
    from ggufbridge.errors import GGUFFileError
    from ggufbridge.ggufio.reader import read_header

    kv, tensors = None, []
    for p in parts or (path,):
        try:
            h = read_header(p)
        except (GGUFFileError, OSError) as e:
            raise PlanError(f"{p}: not a readable GGUF ({e})") from None
        kv = h.kv if kv is None else kv
        tensors += [(t.name, int(t.nbytes)) for t in h.tensors]
    return kv, tensors


def _need(fields: dict, key: str, path: Path):
    if key not in fields:
        raise PlanError(f"{path}: GGUF key {key} missing (needed for the memory plan)")
    return fields[key]


def _per_layer(value, n: int, key: str) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(value) != n:
            raise PlanError(f"{key}: expected {n} per-layer values, found {len(value)}")
        return tuple(int(v) for v in value)
    return (int(value),) * n


def _fields_of(path: Path, arch: str, parts: tuple[Path, ...] = ()):
    """_gguf_fields of a file that must be of architecture `arch`."""
    fields, tensors = _gguf_fields(path, parts)
    found = fields.get("general.architecture")
    if found != arch:
        raise PlanError(f"{path}: expected general.architecture {arch}, found {found!r}")
    return fields, tensors


def target_from_gguf(path: str | Path, parts: tuple[Path, ...] = ()) -> TargetShape:
    """The target's shapes and bytes per layer from its header (a split model: from every part's)."""
    path = Path(path)
    fields, tensors = _fields_of(path, "qwen35moe", parts)
    p = "qwen35moe."
    n_all = int(_need(fields, p + "block_count", path))
    n = n_all - int(fields.get(p + "nextn_predict_layers", 0))
    if p + "attention.recurrent_layers" in fields:
        rec = tuple(bool(v) for v in fields[p + "attention.recurrent_layers"])[:n]
    else:
        interval = int(fields.get(p + "full_attention_interval", 4))
        rec = tuple((i + 1) % interval != 0 for i in range(n))
    n_head = _need(fields, p + "attention.head_count", path)
    heads_kv = fields.get(p + "attention.head_count_kv", n_head)
    n_embd = int(_need(fields, p + "embedding_length", path))
    h0 = n_head[0] if isinstance(n_head, list) else n_head
    kl = int(fields.get(p + "attention.key_length", n_embd // int(h0)))
    vl = int(fields.get(p + "attention.value_length", n_embd // int(h0)))
    return TargetShape(
        n_layer=n, recurrent=rec, n_head_kv=_per_layer(heads_kv, n_all, "head_count_kv")[:n],
        key_length=kl, value_length=vl,
        conv_kernel=int(_need(fields, p + "ssm.conv_kernel", path)),
        state_size=int(_need(fields, p + "ssm.state_size", path)),
        group_count=int(_need(fields, p + "ssm.group_count", path)),
        inner_size=int(_need(fields, p + "ssm.inner_size", path)),
        n_vocab=len(fields.get("tokenizer.ggml.tokens", [])),
        n_ctx_train=int(fields.get(p + "context_length", 0)), n_embd=n_embd).with_tensor_bytes(tensors)


def draft_from_gguf(path: str | Path) -> DraftShape:
    path = Path(path)
    fields, tensors = _fields_of(path, "dflash")
    p = "dflash."
    n_head = int(_need(fields, p + "attention.head_count", path))
    n_embd = int(_need(fields, p + "embedding_length", path))
    bs = draft_value(fields, "block_size", path)  # ours (dflash.*) or upstream's (dspark.*) key
    layers = draft_value(fields, "target_layers", path)
    return DraftShape(
        n_layer=int(_need(fields, p + "block_count", path)),
        n_head_kv=int(fields.get(p + "attention.head_count_kv", n_head)),
        key_length=int(fields.get(p + "attention.key_length", n_embd // n_head)),
        value_length=int(fields.get(p + "attention.value_length", n_embd // n_head)),
        weight_bytes=sum(b for _, b in tensors), block_size=int(bs) if bs is not None else None,
        target_layers=len(layers) if isinstance(layers, (list, tuple)) or hasattr(layers, "tolist") else 0)


def gguf_tensor_bytes(path: str | Path, parts: tuple[Path, ...] = ()) -> int:
    return sum(b for _, b in _gguf_fields(Path(path), parts)[1])


# ------------------------------------------------------------------------------------------ the plan

CATEGORIES = ("weights", "kv", "state", "draft", "mmproj", "compute")


# llama.cpp's device names (ggml_backend_dev_name): local GPU i of a backend is PREFIX<i>, RPC worker i is RPC<i>
DEVICE_PREFIX = {"cuda": "CUDA", "metal": "MTL", "vulkan": "Vulkan", "hip": "ROCm", "sycl": "SYCL"}


POOL_KINDS = ("rpc", "gpu", "host")  # an RPC worker's device, a local GPU (or unified memory), host memory


@dataclass
class Pool:
    name: str
    kind: str  # one of POOL_KINDS
    budget: int
    use: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    device: str | None = None  # llama.cpp's name for it (RPC0, CUDA0, ...); None: the host, or a backend not named

    @property
    def total(self) -> int:
        return sum(self.use.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.budget


@dataclass
class MemoryPlan:
    recipe: str
    ctx: int
    n_gpu_layers: int
    n_cpu_moe: int
    tensor_split: list[float] | None
    pools: list[Pool]
    figures: dict
    notes: list[str]
    layers: list[str] = field(default_factory=list)  # pool of each block, then of the output layer
    slots: int = 1  # -np: each slot has `ctx` tokens of context and its own recurrent state

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.pools)

    @property
    def kv_cells(self) -> int:
        """Cells of the KV pool: every slot's context, each padded to 256 as the runtime pads -c."""
        return self.slots * _pad(self.ctx)

    def context_args(self) -> list[str]:
        """llama-server's -c / -np for this plan. One slot: -c ctx (the runtime pads it to 256). Several: one unified
        pool of slots x padded ctx cells, each slot capped at the padded ctx, as much as one slot alone would get
        (why unified: the module docstring)."""
        if self.slots == 1:
            return ["-c", str(self.ctx), "-np", "1"]
        return ["-c", str(self.kv_cells), "-np", str(self.slots), "--kv-unified",
                "--kv-unified-per-slot", str(_pad(self.ctx))]

    def format(self) -> str:
        f = self.figures
        lines = [f"memory plan (recipe {self.recipe}): {' '.join(self.context_args())} -ngl {self.n_gpu_layers} "
                 f"--n-cpu-moe {self.n_cpu_moe}" + (f" --tensor-split {','.join(f'{x:g}' for x in self.tensor_split)}"
                                                   if self.tensor_split else ""),
                 f"  slots: {self.slots} x {self.ctx:,} tokens of context"
                 + (f" (one unified KV pool of {f['kv_cells']:,} cells; -b {f['server_batch']:,}: prompts arriving "
                    f"together are prefilled in one server iteration)" if self.slots > 1 else ""),
                 f"  KV cache: {f['kv_per_token']:,} B/token x {f['kv_cells']:,} cells = {_gib(f['kv_total'])} "
                 f"({f['attention_layers']} full-attention layers; {f['recurrent_layers']} recurrent layers hold none)",
                 f"  gated-delta-net state: {f['state_per_slot']:,} B per slot x {f['slots']} slot(s) x "
                 f"{f['state_snapshots']} snapshot(s) = {_gib(f['state_total'])} (independent of context)",
                 f"  context checkpoints (host RAM): up to {CTX_CHECKPOINTS} per slot x {f['state_per_slot']:,} B "
                 f"= {_gib(f['checkpoints_total'])}"]
        if f.get("draft_weights"):
            lines.append(f"  draft: weights {_gib(f['draft_weights'])}, KV {f['draft_kv_per_token']:,} B/token "
                         f"= {_gib(f['draft_kv_total'])}, attention mask {_gib(f['draft_mask'])}")
        if f.get("mmproj"):
            lines.append(f"  mmproj: {_gib(f['mmproj'])}")
        if len(set(self.layers)) > 1:
            lines.append(f"  layers: {_layer_ranges(self.layers)}")
        lines.append(f"  {'device':<22}" + "".join(f"{c:>12}" for c in CATEGORIES) + f"{'total':>12}{'budget':>12}")
        for p in self.pools:
            lines.append(f"  {p.name:<22}" + "".join(f"{_gib(p.use[c], 2):>12}" for c in CATEGORIES)
                         + f"{_gib(p.total, 2):>12}{_gib(p.budget, 2):>12}" + ("" if p.fits else "  OVER"))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "ctx": self.ctx, "slots": self.slots, "kv_cells": self.kv_cells,
                "server_context_args": self.context_args(), "n_gpu_layers": self.n_gpu_layers,
                "n_cpu_moe": self.n_cpu_moe, "tensor_split": self.tensor_split, "fits": self.fits,
                "figures": self.figures, "notes": self.notes, "layers": self.layers,
                "pools": [{"name": p.name, "budget": p.budget, "use": p.use, "total": p.total} for p in self.pools]}


def _layer_ranges(layers: list[str]) -> str:
    """'host 0-1, rpc0 2-3, rpc1 output': consecutive blocks per pool, the output layer (last entry) named."""
    runs: list[list] = []
    for i, pool in enumerate(layers[:-1]):
        if runs and runs[-1][0] == pool:
            runs[-1][2] = i
        else:
            runs.append([pool, i, i])
    parts = [f"{pool} {a}-{b}" if a != b else f"{pool} {a}" for pool, a, b in runs]
    return ", ".join(parts) + f"; output on {layers[-1]}"


def _gib(n: int, digits: int = 2) -> str:
    """Human size; GiB for anything of a real model, smaller units for test models."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= size or unit == "KiB" and n:
            return f"{n / size:.{digits}f} {unit}"
    return "0"


def _pools(recipe: Recipe, rpc_workers: int) -> tuple[list[Pool], Pool]:
    """(devices in llama.cpp order, host pool). RPC workers come first, as the runtime orders them."""
    mem = recipe.memory
    prefix = DEVICE_PREFIX.get(recipe.backend)
    gpu = (lambda i: f"{prefix}{i}") if prefix else (lambda i: None)
    worker = int((recipe.rpc["worker_gib"] - recipe.rpc["worker_headroom_gib"]) * GIB)
    rpc = [Pool(f"rpc{i}", "rpc", worker, device=f"RPC{i}") for i in range(rpc_workers)]
    if mem["unified"]:
        shared = Pool("gpu0 (unified)", "gpu", int((mem["gpu_gib"][0] - mem["headroom_gib"]) * GIB), device=gpu(0))
        return rpc + [shared], shared
    gpus = [Pool(f"gpu{i}", "gpu", int((g - mem["headroom_gib"]) * GIB), device=gpu(i))
            for i, g in enumerate(mem["gpu_gib"])]
    host = Pool("host", "host", int((mem["host_gib"] - mem["host_headroom_gib"]) * GIB))
    return rpc + gpus, host


def _pad(ctx: int) -> int:
    return -(-ctx // KV_PAD) * KV_PAD


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _tensor_split(devices: list[Pool]) -> list[float] | None:
    """What the server is given as --tensor-split: each device's budget in whole GiB (one device: none)."""
    return [float(d.budget // GIB) for d in devices] if len(devices) > 1 else None


def _assign(n_devices: int, split: list[float] | None, n_layer: int, ngl: int) -> list[int | None]:
    """Device index (None = host) of each block and, last, of the output layer, for -ngl ngl and the plan's
    --tensor-split, exactly as llama_model::load_tensors assigns them (src/llama-model.cpp:1556-1614, in float32):
    -ngl counts the output layer, so -ngl n keeps the first n_layer + 1 - n blocks on the host."""
    start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1) if n_devices else 0
    cum, acc = [], 0.0
    for x in split or [1.0] * n_devices:
        acc = _f32(acc + x)
        cum.append(acc)
    cum = [_f32(c / acc) for c in cum]
    out: list[int | None] = [None] * (n_layer + 1)
    for il in range(n_layer + 1):
        if il < start or il - start >= act:
            continue
        frac = _f32(_f32(il - start) / act)
        out[il] = min(bisect.bisect_right(cum, frac), n_devices - 1)  # std::upper_bound
    return out


def offloaded(n_layer: int, ngl: int) -> list[bool]:
    """Whether each block and, last, the output layer sits on the GPU for -ngl ngl on a machine with one GPU (the
    input layer, the token embedding, never does: src/llama-model.cpp:1603-1605)."""
    return [d is not None for d in _assign(1, None, n_layer, ngl)]


def evaluate(target: TargetShape, recipe: Recipe, *, ctx: int, ngl: int, n_cpu_moe: int,
             draft: DraftShape | None = None, mmproj_bytes: int = 0, rpc_workers: int = 0,
             slots: int | None = None) -> MemoryPlan:
    """Bytes per device for one setting (`ctx` tokens per slot, `slots` slots: default the recipe's
    server.parallel). Does not search; see `make_plan`."""
    srv, drf = recipe.server, recipe.draft
    devices, host = _pools(recipe, rpc_workers)
    notes: list[str] = []
    pools = list(devices) + ([host] if host not in devices else [])
    split = _tensor_split(devices)
    where = _assign(len(devices), split, target.n_layer, ngl)
    dev = [devices[w] if w is not None else host for w in where[:-1]]
    slots = srv["parallel"] if slots is None else slots
    cells = slots * _pad(ctx)  # the KV pool (MemoryPlan.kv_cells); the draft's and the attention mask's extent too
    n_rs_seq = drf["n_max"] if draft else 0
    snapshots = 1 + n_rs_seq
    tk, tv = srv["cache_type_k"], srv["cache_type_v"]

    host.use["weights"] += target.input_bytes
    out_pool = devices[where[-1]] if where[-1] is not None else host
    out_pool.use["weights"] += target.output_bytes
    state_layer = target.state_layer_bytes()
    for il in range(target.n_layer):
        d = dev[il]
        d.use["weights"] += target.block_bytes[il] if target.block_bytes else 0
        if target.expert_bytes:
            (host if il < n_cpu_moe else d).use["weights"] += target.expert_bytes[il]
        d.use["kv"] += target.kv_layer_bytes_per_token(il, tk, tv) * cells
        if target.recurrent[il]:
            d.use["state"] += state_layer * slots * snapshots

    figures = {
        "kv_per_token": target.kv_bytes_per_token(tk, tv), "kv_cells": cells,
        "kv_total": target.kv_bytes_per_token(tk, tv) * cells,
        "attention_layers": len(target.attention_layers), "recurrent_layers": len(target.recurrent_layers),
        "state_per_slot": target.state_bytes_per_slot(), "slots": slots, "state_snapshots": snapshots,
        "state_total": target.state_bytes_per_slot() * slots * snapshots,
        "checkpoints_total": target.state_bytes_per_slot() * slots * CTX_CHECKPOINTS,
        "target_weights": target.weight_bytes, "mmproj": mmproj_bytes,
        "server_batch": served_batch(srv["batch"], slots),  # llama-server's -b
    }
    host.use["state"] += figures["checkpoints_total"]
    if draft is not None:
        dpool = devices[-1] if devices and drf["n_gpu_layers"] != 0 else host
        dkv = draft.kv_bytes_per_token(drf["cache_type_k"], drf["cache_type_v"])
        # the draft context has the target's n_ctx: its KV and its attention mask (2 bytes per -ub token and cell,
        # the whole of its compute buffer beside a constant) span the pool
        dpool.use["draft"] += draft.weight_bytes + dkv * cells + 2 * srv["ubatch"] * cells
        # the target's output buffer keeps the inputs of the layers the draft reads, F32, for -b tokens (in host
        # memory: src/llama-context.cpp:2151-2154, 2225-2226), so it grows with the slots' -b (served_batch)
        hidden = 4 * target.n_embd * figures["server_batch"] * draft.target_layers
        host.use["draft"] += hidden
        figures.update(draft_weights=draft.weight_bytes, draft_kv_per_token=dkv, draft_kv_total=dkv * cells,
                       draft_mask=2 * srv["ubatch"] * cells, draft_target_hidden=hidden)
        if draft.block_size is not None and drf["n_max"] > draft.block_size:
            notes.append(f"draft.n_max {drf['n_max']} exceeds the draft's block_size {draft.block_size}; "
                         f"the runtime clamps it")
    if mmproj_bytes:
        local_gpus = [d for d in devices if d.kind == "gpu"]
        (local_gpus[0] if local_gpus and srv["mmproj_offload"] else host).use["mmproj"] += mmproj_bytes
    _add_compute(recipe, target, devices, host, dev + [out_pool], cells, n_cpu_moe,
                 slot_states=slots * snapshots if slots > 1 else 0)
    return MemoryPlan(recipe=recipe.name, ctx=ctx, n_gpu_layers=ngl if devices else 0, n_cpu_moe=n_cpu_moe,
                tensor_split=split, pools=pools, figures=figures, notes=notes,
                layers=[d.name for d in dev] + [out_pool.name], slots=slots)


def _add_compute(recipe: Recipe, target: TargetShape, devices: list[Pool], host: Pool, dev: list[Pool], cells: int,
                 n_cpu_moe: int, slot_states: int = 0) -> None:
    """Compute buffers per pool (model in the module docstring), plus the recipe's fixed compute_mib per pool
    (a recipe without compute_token_kib has only that: 1024 MiB unless it says otherwise). `slot_states`: slots x
    snapshots when there are several slots (0 for one, which the per-token figure covers)."""
    mem, srv = recipe.memory, recipe.server
    fixed = mem["compute_mib"] if mem["compute_mib"] is not None else (0 if mem["compute_token_kib"] else 1024)
    for p in list(devices) + [host]:
        if p.total or p is host:
            p.use["compute"] += int(fixed * MIB)
    if mem["compute_token_kib"] is None:
        return
    ub = srv["ubatch"]
    # several slots: the reserved graph gathers one recurrent layer's state for every slot and snapshot, in and out
    graph = int(ub * mem["compute_token_kib"] * 1024) + 2 * ub * cells + 2 * slot_states * target.state_layer_bytes()
    runs = [d for d in devices if any(x is d for x in dev)]
    if not runs:  # CPU only: the host runs the graph
        host.use["compute"] += graph
        return
    quant_kv = any(t not in ("f16", "bf16", "f32") for t in (srv["cache_type_k"], srv["cache_type_v"]))
    heads = max(target.n_head_kv) if target.n_head_kv else 0
    dequant = cells * heads * (target.key_length + target.value_length) * 2 if quant_kv else 0
    staged = max((target.expert_max_bytes[i] for i in range(min(n_cpu_moe, target.n_layer))), default=0) \
        if target.expert_max_bytes else 0
    for d in runs:
        d.use["compute"] += graph + dequant + staged + int(mem["context_mib"] * MIB)
    host.use["compute"] += ub * (2 * cells + 8 * target.n_embd)


def _choices(setting, n_layer: int, descending: bool) -> list[int]:
    if setting == "all":
        return [n_layer + 1] if descending else [n_layer]
    if setting == "auto":
        r = range(n_layer + 1, -1, -1) if descending else range(0, n_layer + 1)
        return list(r)
    return [int(setting)]


def make_plan(target: TargetShape, recipe: Recipe, *, ctx: int | None = None, draft: DraftShape | None = None,
              mmproj_bytes: int = 0, rpc_workers: int | None = None, slots: int | None = None) -> MemoryPlan:
    """Pick -c / -ngl / --n-cpu-moe so everything fits every device; raise PlanError when nothing does.

    `slots` (-np; default the recipe's server.parallel) is never changed: each slot gets the chosen context. Search
    order (first fit wins): the recipe's context (at most the model's trained context, and at most draft.ctx_cap
    with a draft), then halved down to server.min_ctx (an explicit `ctx` is never changed); per context, most
    layers on the GPU first and, per layer count, the fewest blocks whose experts stay in host memory. When the
    slots do not fit, the error names how many do.
    """
    srv = recipe.server
    slots = srv["parallel"] if slots is None else slots
    if slots < 1:
        raise PlanError(f"slots (-np): expected at least 1, found {slots}")
    workers = recipe.rpc["workers"] if rpc_workers is None else rpc_workers
    notes = []
    if ctx is not None:
        contexts = [ctx]
    else:
        top = srv["ctx"]
        if target.n_ctx_train and target.n_ctx_train < top:
            top = target.n_ctx_train
            notes.append(f"context capped at the model's trained context ({top})")
        if draft is not None and recipe.draft["ctx_cap"] < top:
            top = recipe.draft["ctx_cap"]
            notes.append(f"context capped at {top} with the draft (draft.ctx_cap); pass --ctx to override")
        lo = min(srv["min_ctx"], top)
        contexts, c = [top], top
        while c > lo:
            c = max(c // 2, lo)
            contexts.append(c)
    kw = dict(draft=draft, mmproj_bytes=mmproj_bytes, rpc_workers=workers)
    found, last = _search(target, recipe, contexts, slots, **kw)
    if found is not None:
        found.notes += notes
        if found.ctx != contexts[0]:
            found.notes.append(f"context reduced from {contexts[0]} to {found.ctx} to fit")
        if slots > 1 and found.n_cpu_moe:
            found.notes.append(f"{slots} slots keep the routed experts of {found.n_cpu_moe} block(s) in host memory "
                               f"(slower decoding); a smaller --ctx per slot or fewer --parallel slots keeps more "
                               f"of them on the GPU")
        return found
    over = [p for p in last.pools if not p.fits]
    detail = "; ".join(f"{p.name} needs {_gib(p.total)} of {_gib(p.budget)} "
                       f"({', '.join(f'{k} {_gib(v)}' for k, v in p.use.items() if v)})" for p in over)
    fewer = _most_slots(target, recipe, contexts, slots - 1, **kw) if slots > 1 else None
    if fewer is not None:
        raise PlanError(f"{slots} slots (-np {slots}) do not fit recipe {recipe.name}: even at {last.ctx} tokens "
                        f"each, {detail}; at most {fewer.slots} slot(s) fit, at {fewer.ctx} tokens each "
                        f"(--parallel {fewer.slots})")
    raise PlanError(f"the model does not fit recipe {recipe.name}: even at -c {last.ctx} -ngl {last.n_gpu_layers} "
                    f"--n-cpu-moe {last.n_cpu_moe}, {detail}; use a smaller quant, a smaller --ctx, or a recipe "
                    f"with more memory")


def _search(target: TargetShape, recipe: Recipe, contexts: list[int], slots: int,
            **kw) -> tuple[MemoryPlan | None, MemoryPlan]:
    """(the first setting that fits, in make_plan's order, or None; the last one tried)."""
    srv = recipe.server
    has_devices = bool(recipe.memory["gpu_gib"]) or kw["rpc_workers"] > 0
    ngls = _choices(srv["n_gpu_layers"], target.n_layer, True) if has_devices else [0]
    cmoes = _choices(srv["n_cpu_moe"], target.n_layer, False) if has_devices else [0]
    last = None
    for c in contexts:
        for ngl in ngls:
            for ncm in cmoes:
                last = evaluate(target, recipe, ctx=c, ngl=ngl, n_cpu_moe=ncm, slots=slots, **kw)
                if last.fits:
                    return last, last
    return None, last


def _most_slots(target: TargetShape, recipe: Recipe, contexts: list[int], top: int, **kw) -> MemoryPlan | None:
    """The plan with the most slots (at most `top`) that fits, or None when not even one does. Memory grows
    with every slot, so a binary search over the count is exact."""
    best, lo, hi = None, 1, top
    while lo <= hi:
        mid = (lo + hi) // 2
        found, _ = _search(target, recipe, contexts, mid, **kw)
        if found is not None:
            best, lo = found, mid + 1
        else:
            hi = mid - 1
    return best
