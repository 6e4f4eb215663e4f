"""Does a DSpark draft GGUF fit its target GGUF? The coupling rules `convert` checks on checkpoints
(arch.dspark.check_pairing, runtime-facts D.5), checked here on the files themselves, so that a draft made by any
converter — ours, or llama.cpp's — is refused with one line before a server starts rather than aborting in it.

Key conventions. Ours and the pinned tree's converter store the DSpark values under the architecture's prefix
(`dflash.block_size`, `dflash.target_layers`, ...). Drafts written by upstream llama.cpp's converter after our pin
(docs/gguf-files.md, "Drafts from other converters") carry them as `dspark.*`. Both are read (`DRAFT_KEYS`); a file
holding both with different values is refused. The pinned runtime reads only `dflash.*` (its DSpark graph asserts
`dflash.block_size`), so such a draft is served from a copy whose keys are renamed (`normalised_draft`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from ggufbridge.errors import GGUFFileError, PairingError
from ggufbridge.ggufio.names import DFLASH_ARCH, DRAFT_KEYS, DSPARK_UPSTREAM_PREFIX, upstream_draft_keys
from ggufbridge.ggufio.names import draft_value as _draft_value
from ggufbridge.ggufio.reader import GGUFHeader, read_header

log = logging.getLogger(__name__)

DRAFT_ARCH = DFLASH_ARCH


def draft_value(kv: dict, name: str, where):
    """names.draft_value, its disagreement a PairingError (a draft that contradicts itself)."""
    try:
        return _draft_value(kv, name, where)
    except GGUFFileError as e:
        raise PairingError(str(e)) from None


def _plain(v):
    return v.tolist() if hasattr(v, "tolist") else v


def _vocab(h: GGUFHeader) -> list:
    tokens = h.kv.get("tokenizer.ggml.tokens")
    return tokens if isinstance(tokens, list) else []


def check_draft(target: list[GGUFHeader], draft: GGUFHeader) -> None:
    """PairingError (one line, naming the expected and found values) unless `draft` can draft for `target` (the
    target's headers: one per part of a split model, the first holding the metadata)."""
    t, kv, where = target[0], draft.kv, draft.path
    arch = kv.get("general.architecture")
    if arch != DRAFT_ARCH:
        raise PairingError(f"{where}: a draft must have general.architecture {DRAFT_ARCH}, found {arch!r}")
    ta = t.kv.get("general.architecture")
    n_layer = int(t.kv.get(f"{ta}.block_count", 0)) - int(t.kv.get(f"{ta}.nextn_predict_layers", 0))
    vocab = _vocab(t)
    n_vocab = len(vocab)
    block = draft_value(kv, "block_size", where)
    if block is None:
        raise PairingError(f"{where}: no block size ({' or '.join(DRAFT_KEYS['block_size'])}); the runtime's DSpark "
                           f"graph needs it")
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise PairingError(f"{where}: block size must be a positive integer, found {block!r}")
    taps = draft_value(kv, "target_layers", where)
    if taps is None:
        raise PairingError(f"{where}: no target layers ({' or '.join(DRAFT_KEYS['target_layers'])})")
    taps = _plain(taps)
    if not isinstance(taps, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in taps):
        raise PairingError(f"{where}: target layers must be a list of layer numbers, found {taps!r:.80}")
    bad = [x for x in taps if not 1 <= x <= n_layer - 1]
    if not taps or bad:
        raise PairingError(f"{where}: target layers must lie in [1, {n_layer - 1}] for the {n_layer}-layer target, "
                           f"found {taps}")
    hidden, t_hidden = kv.get(f"{DRAFT_ARCH}.embedding_length"), t.kv.get(f"{ta}.embedding_length")
    if hidden != t_hidden:
        raise PairingError(f"{where}: draft embedding_length must equal the target's {t_hidden}, found {hidden}")
    dvocab = _vocab(draft)
    if dvocab and dvocab != vocab:
        first = next((i for i, (a, b) in enumerate(zip(dvocab, vocab)) if a != b), min(len(dvocab), n_vocab))
        raise PairingError(f"{where}: the draft's tokenizer differs from the target's ({len(dvocab)} vs {n_vocab} "
                           f"tokens, first difference at id {first})")
    mask = kv.get("tokenizer.ggml.mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < n_vocab:
        raise PairingError(f"{where}: tokenizer.ggml.mask_token_id must be inside the target vocabulary "
                           f"[0, {n_vocab}), found {mask!r}")
    tensors = {ti.name: ti for ti in draft.tensors}
    d2t = tensors.get("d2t")
    draft_vocab = d2t.shape[0] if d2t is not None else n_vocab
    w1, w2 = tensors.get("markov_w1.weight"), tensors.get("markov_w2.weight")
    if w1 is None or w2 is None:
        raise PairingError(f"{where}: a DSpark draft needs its Markov head (markov_w1.weight, markov_w2.weight)")
    if w1.shape[-1] != n_vocab:
        raise PairingError(f"{where}: markov_w1 must have one row per target token ({n_vocab}), found {w1.shape[-1]}")
    if w2.shape[-1] != draft_vocab:
        raise PairingError(f"{where}: markov_w2 must have one row per draft token ({draft_vocab}), found "
                           f"{w2.shape[-1]}")
    if d2t is not None:
        out = tensors.get("output.weight")
        if out is None or out.shape[-1] != draft_vocab:
            raise PairingError(f"{where}: a draft with d2t ({draft_vocab} draft tokens) needs its own output.weight "
                               f"with {draft_vocab} rows, found {None if out is None else out.shape[-1]}")
    target_names = {ti.name for h in target for ti in h.tensors}
    for own, shared in (("token_embd.weight", "token embeddings"), ("output.weight", "output head")):
        if own not in tensors and own not in target_names:
            raise PairingError(f"{where}: the draft has no {own} and the target has none to share ({shared})")


# --- a copy the pinned runtime reads -------------------------------------------------------------------------------

def normalised_draft(path: Path, cache: Path) -> Path:
    """`path` itself when it holds every DSpark value as `dflash.*`; else a copy (in `cache`, made once per file
    content identity) whose `dspark.*` keys are renamed to `dflash.*`, the tensor table and data copied verbatim."""
    from ggufbridge.ggufio.rewrite import rename_keys

    h = read_header(path)
    missing = upstream_draft_keys(h.kv)
    if not missing:
        return path
    st = path.stat()
    ident = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = cache / f"{path.stem}.{ident}.dflash-keys.gguf"
    if dest.is_file():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    renames = {k: f"{DFLASH_ARCH}." + k.removeprefix(DSPARK_UPSTREAM_PREFIX) for k in missing}
    log.info("%s: upstream DSpark keys %s; serving a copy with them as %s (%s)", path, ", ".join(missing),
             ", ".join(renames.values()), dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        rename_keys(path, tmp, renames)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
