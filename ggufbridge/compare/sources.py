"""Logit sources: the models (or dumps) whose next-token distributions `compare` and `dump-logits` read.

A spec names a backend and a path:

* `hf:DIR`     the upstream checkpoint through transformers (float32; `dtype="bfloat16"` for the floor)
* `gguf:FILE`  a GGUF file through llama.cpp (llama-cpp-python)
* `exl3:DIR`   an EXL3 pack through exllamav3 (CUDA only; see `ggufbridge.compare.exl3`)
* `logits:FILE` a dump written by `dump-logits` (top-K form)

Every source yields one row's positions in chunks of at most `chunk` positions, so no more than one chunk of
logits per source is ever held in host memory. A bare path (no prefix) is taken as `gguf:` if it ends in
.gguf, `logits:` if it ends in .safetensors, and `hf:` if it is a folder.

`hf:` also takes a hub model, `hf:hf://ORG/NAME[@REV]` or `hf:ms://ORG/NAME[@REV]` (a bare `hf://…` / `ms://…`
means the same): it is downloaded into that hub's cache first (see ggufbridge.checkpoint.hub). `hf:DIR` keeps its
meaning, a folder read through transformers: the `://` tells the two apart.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ggufbridge.native import quiet_native
from ggufbridge.checkpoint import hub
from ggufbridge.checkpoint.hub import HubSpec
from ggufbridge.compare.evalset import Row
from ggufbridge.compare.metrics import Dense, TopK
from ggufbridge.errors import ConfigError, DeviceUnavailable, GGUFBridgeError, GGUFFileError, LogitsMismatch
from ggufbridge.untrusted import load_json

log = logging.getLogger(__name__)

KINDS = ("hf", "gguf", "exl3", "logits")
HF_DTYPES = ("float32", "bfloat16")


def hub_model(spec: str) -> HubSpec | None:
    """The hub model a spec names (`hf:hf://…`, `hf:ms://…`, bare `hf://…` / `ms://…`), else None."""
    found = hub.parse_spec(spec)
    if found is None and spec.startswith("hf:"):
        found = hub.parse_spec(spec[len("hf:"):])
    return found


def localize(spec: str, *, progress: bool = False) -> str:
    """A spec naming a hub model → `hf:<its local snapshot>`, downloaded first; any other spec unchanged."""
    found = hub_model(spec)
    return spec if found is None else f"hf:{hub.download(found, progress=progress)}"


def parse_spec(spec: str) -> tuple[str, Path]:
    """'kind:path' → (kind, path); a bare path is classified by its suffix / being a folder; a hub model is an hf:
    folder (downloaded, or found in the cache: call `localize` once first to show progress)."""
    found = hub_model(spec)
    if found is not None:
        return "hf", hub.download(found)
    kind, sep, rest = spec.partition(":")
    if sep and kind in KINDS:
        return kind, Path(rest)
    p = Path(spec)
    if p.suffix == ".gguf":
        return "gguf", p
    if p.suffix == ".safetensors":
        return "logits", p
    if p.is_dir():
        return "hf", p
    raise GGUFBridgeError(f"model spec {spec!r}: expected one of {', '.join(k + ':PATH' for k in KINDS)}, "
                          "or hf://ORG/NAME[@REV] / ms://ORG/NAME[@REV]")


class Source(ABC):
    """One model's next-token distributions over eval rows."""

    spec: str
    vocab_size: int
    bits_per_weight: float | None = None
    family: str | None = None  # how plots group candidates (one line per family); None: by backend

    def tokenize(self, text: str) -> list[int] | None:
        """Token ids of `text` without BOS, or None if this source has no tokenizer."""
        return None

    @abstractmethod
    def chunks(self, index: int, row: Row, chunk: int) -> Iterator[Dense | TopK]:
        """Positions 0..len(row)-1 of eval row number `index`, in order, at most `chunk` per item."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class HFSource(Source):
    """transformers model; the body runs once per row, the LM head per chunk (its output is the large part)."""

    def __init__(self, path: Path, dtype: str = "float32"):
        import torch
        import transformers

        if dtype not in HF_DTYPES:
            raise GGUFBridgeError(f"hf dtype must be one of {HF_DTYPES}, found {dtype!r}")
        cfg_path = Path(path) / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(2, "No such file (hf: needs a checkpoint folder)", str(cfg_path))
        config = load_json(cfg_path, ConfigError, max_bytes=64 << 20, what="model configuration")
        archs = (config.get("architectures") if isinstance(config, dict) else None) or []
        named = isinstance(archs, list) and archs and isinstance(archs[0], str)
        cls = getattr(transformers, archs[0], None) if named else None
        if cls is None:
            raise GGUFBridgeError(f"{cfg_path}: architecture {archs} is not available in transformers "
                                  f"{transformers.__version__}")
        self.spec = f"hf:{path}" + ("" if dtype == "float32" else f" ({dtype})")
        self.dtype = dtype
        self.model = cls.from_pretrained(str(path), dtype=getattr(torch, dtype), attn_implementation="eager").eval()
        self.decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        self.vocab_size = int(self.head.weight.shape[0])
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))

    def tokenize(self, text):
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chunks(self, index, row, chunk):
        import torch

        with torch.no_grad():
            hidden = self.decoder(input_ids=torch.tensor([row.ids])).last_hidden_state[0]
            for a in range(0, len(row.ids), chunk):
                yield Dense(self.head(hidden[a:a + chunk]).float().numpy())


def gguf_role(path) -> str:
    """target, mmproj, draft or imatrix, from the file's header (the rule of `ggufbridge inspect`)."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.ggufio.names import role_of

    return role_of(read_header(path).kv)


class GGUFSource(Source):
    """llama.cpp through llama-cpp-python. Rows are decoded chunk by chunk with output for every position;
    only the current chunk's logits are copied out (Llama(logits_all=True) would keep n_ctx × vocab floats)."""

    def __init__(self, path: Path, *, n_ctx: int, chunk: int, n_gpu_layers: int = 0, n_threads: int | None = None,
                 use_mmap: bool = True):
        import llama_cpp

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(2, "No such file", str(path))
        role = gguf_role(path)
        if role != "target":
            raise GGUFFileError(f"{path}: a {role} GGUF, not a language model (compare and dump-logits take the "
                                f"target GGUF)")
        self.spec = f"gguf:{path}"
        self.path = path
        self.chunk = chunk
        try:
            with quiet_native():
                self.llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=chunk, n_ubatch=chunk, logits_all=False,
                                           n_gpu_layers=n_gpu_layers, n_threads=n_threads, n_threads_batch=n_threads,
                                           use_mmap=use_mmap, verbose=False)
        except ValueError as e:  # llama-cpp-python's only word for a model llama.cpp refused
            raise GGUFFileError(f"{path}: llama.cpp cannot load it ({e})") from None
        self.vocab_size = int(self.llm.n_vocab())
        self.bits_per_weight, recipe = gguf_facts(path)
        # files from a ggufbridge recipe (hq4, hq3, ...) form their own line beside llama.cpp's mixes, and the
        # KL-guided mixes of `quantize --fit-bytes` (recipe fit-HASH) another
        self.family = ("GGUF, KL-guided mix (--fit-bytes)" if recipe and recipe.startswith("fit-") else
                       "GGUF, ggufbridge recipes" if recipe else "GGUF")

    def tokenize(self, text):
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def chunks(self, index, row, chunk):
        if chunk > self.chunk:
            raise ValueError(f"chunk {chunk} exceeds this context's batch size {self.chunk}")
        llm = self.llm
        llm.reset()  # clears the KV cache and the recurrent state
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        ids = list(row.ids)
        for a in range(0, len(ids), chunk):
            piece = ids[a:a + chunk]
            llm._batch.set_batch(batch=piece, n_past=a, logits_all=True)
            llm._ctx.decode(llm._batch)
            out = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(piece) * self.vocab_size,))
            yield Dense(out.reshape(len(piece), self.vocab_size).copy())

    def close(self):
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            self.llm = None


def gguf_facts(path: Path) -> tuple[float, str | None]:
    """(bits per weight: 8 × tensor bytes / tensor elements over every tensor, the ggufbridge quantisation recipe
    the file was made with (`ggufbridge.quant.recipe`) or None), from the GGUF header."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.ggufio.names import QUANT_MIX

    h = read_header(path)
    nbytes = sum(t.nbytes for t in h.tensors)
    nelem = sum(t.n_elements for t in h.tensors)
    recipe = h.kv.get(QUANT_MIX)
    return (8.0 * nbytes / nelem if nelem else float("nan")), recipe if isinstance(recipe, str) else None


class LogitsSource(Source):
    """A `dump-logits` file: every row must carry the same token ids (sha256) as when it was dumped."""

    def __init__(self, path: Path):
        from ggufbridge.compare.dump import DumpReader

        self.reader = DumpReader.open(path)
        self.meta = self.reader.meta
        self.spec = f"logits:{path} (from {self.meta.get('source')})"
        self.vocab_size = int(self.meta["vocab_size"])

    def check_rows(self, rows: list[Row]) -> None:
        hashes = self.meta["row_sha256"]
        if len(hashes) != len(rows):
            raise LogitsMismatch(f"{self.reader.path}: dump holds {len(hashes)} rows, the eval set {len(rows)}")
        for i, (h, r) in enumerate(zip(hashes, rows)):
            if h != r.sha256:
                raise LogitsMismatch(f"{self.reader.path}: row {i}: token hash {r.sha256[:12]} differs from the "
                                     f"dump's {h[:12]} (dumped from another eval set or tokenizer)")

    def chunks(self, index, row, chunk):
        if self.meta["row_sha256"][index] != row.sha256:
            raise LogitsMismatch(f"{self.reader.path}: row {index}: token hash differs from the dump's")
        yield from self.reader.chunks(index, chunk)


class EXL3Source(Source):
    """An EXL3 pack through exllamav3 on a CUDA GPU (the MiniCPM-V 4.7 architecture shim is installed first).
    The full row's logits live on the GPU; host memory receives one chunk at a time."""

    def __init__(self, path: Path, *, n_ctx: int = 1024):
        from ggufbridge.compare import exl3

        torch, exllamav3 = exl3.require_exllamav3()
        exl3.install_shim()
        path = Path(path)
        self.spec = f"exl3:{path}"
        self.torch = torch
        self.config = exllamav3.Config.from_directory(str(path))
        self.model = exllamav3.Model.from_config(self.config)
        # sizes inform exllamav3's memory estimate of the output layer (a whole row's logits, upcast to float32)
        self.model.load(max_chunk_size=max(n_ctx, 2048), max_output_size=n_ctx, max_output_factor=5)
        self.vocab_size = int(self.config.vocab_size)
        self.bits_per_weight = exl3.storage_bpw(self.model)
        self.tokenizer = None
        try:
            import transformers

            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        except Exception as e:  # a pack without HF tokenizer files: ids-only eval sets still work
            log.warning("exl3: no transformers tokenizer in %s (%s)", path, e)

    def tokenize(self, text):
        if self.tokenizer is None:
            return None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chunks(self, index, row, chunk):
        torch = self.torch
        with torch.inference_mode():
            logits = self.model.forward(torch.tensor([row.ids], dtype=torch.long), {"attn_mode": "flash_attn_nc"})
            logits = logits[0, :, : self.vocab_size]  # exllamav3 may pad the head past the vocabulary
            for a in range(0, len(row.ids), chunk):
                yield Dense(logits[a:a + chunk].float().cpu().numpy())
            del logits

    def close(self):
        model = getattr(self, "model", None)
        if model is not None:
            model.unload()
            self.model = None


def open_source(spec: str, *, n_ctx: int, chunk: int, hf_dtype: str = "float32", n_gpu_layers: int = 0) -> Source:
    """`n_gpu_layers`: layers a gguf: model offloads (-1: all), where the runtime has a GPU backend."""
    kind, path = parse_spec(spec)
    if kind == "hf":
        return HFSource(path, hf_dtype)
    if kind == "gguf":
        return GGUFSource(path, n_ctx=n_ctx, chunk=chunk, n_gpu_layers=n_gpu_layers)
    if kind == "logits":
        return LogitsSource(path)
    if kind == "exl3":
        return EXL3Source(path, n_ctx=n_ctx)
    raise AssertionError(kind)


def require_device_for(spec: str) -> None:
    """Fail before any work if a spec needs hardware this machine lacks."""
    kind, _ = parse_spec(spec)
    if kind == "exl3":
        from ggufbridge.compare import exl3

        exl3.require_exllamav3()


__all__ = ["DeviceUnavailable", "EXL3Source", "GGUFSource", "HFSource", "LogitsSource", "Source", "hub_model",
           "localize", "open_source", "parse_spec", "require_device_for"]
