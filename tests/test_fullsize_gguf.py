"""scripts/make_fullsize_gguf.py: the random-weight full-shape GGUFs behind the H200 measurements (issue 8).

References: gguf-py's dequantiser for the hand-built blocks, llama-quantize's own --dry-run for the Q4_K_M type
choices, and the pinned runtime (bindings) for loading the files.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf import quants as gguf_quants

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_fullsize_gguf", ROOT / "scripts" / "make_fullsize_gguf.py")
mf = importlib.util.module_from_spec(_spec)
sys.modules["make_fullsize_gguf"] = mf
_spec.loader.exec_module(mf)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from ggufbridge.synthetic.vocab import write_tokenizer

    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d, "qwen35")
    return d


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q4_0"])
def test_blocks_dequantize_to_centred_weights_of_the_intended_scale(qtype):
    pool = mf.BlockPool(qtype, 512, np.random.default_rng(0))
    raw = pool.take(256 * 512, mf.QK[qtype])
    w = gguf_quants.dequantize(raw.reshape(512, -1), GGMLQuantizationType[qtype]).astype(np.float64)
    assert w.shape == (512, 256) and np.isfinite(w).all()
    assert abs(w.mean()) < 0.05 * mf.WEIGHT_STD
    assert 0.85 * mf.WEIGHT_STD < w.std() < 1.15 * mf.WEIGHT_STD
    # consecutive takes are different runs of the pool (tensors do not all share one block)
    assert not np.array_equal(pool.take(256 * 8, mf.QK[qtype]), pool.take(256 * 8, mf.QK[qtype]))


def _types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


@pytest.mark.slow
def test_q4_k_m_types_are_llama_quantizes_choices(tok_dir, tmp_path):
    """A 40-layer file (the real layer pattern, small widths): our Q4_K_M types == llama-quantize --dry-run's."""
    from ggufbridge.ggufio.tokenizer import read_vocab
    from ggufbridge.ggufio.writer import write_gguf
    from ggufbridge.runtime.locate import locate

    shape = replace(mf.SMOKE, layers="LLLF" * 10)
    vocab = read_vocab(tok_dir, shape.vocab)
    files = {}
    for quant in ("q8_0", "q4_k_m"):
        w = write_gguf(mf.target_plan(shape, quant, vocab, 0), tmp_path / f"{quant}.gguf", "f16")
        w.commit()
        files[quant] = w.path
    rt = locate()
    p = subprocess.run([str(rt.tool("llama-quantize")), "--dry-run", "--allow-requantize", str(files["q8_0"]),
                        "Q4_K_M"], capture_output=True, text=True, env=rt.env(), input="")
    assert p.returncode == 0, p.stderr[-500:]
    want = {}
    for line in (p.stdout + p.stderr).splitlines():
        m = re.match(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- .*type =\s+(\w+),.*?(?:\((\w+)\))?\s*$", line.strip())
        if m:
            want[m.group(1)] = (m.group(3) or m.group(2)).upper()
    got = _types(files["q4_k_m"])
    assert len(want) == len(got) == 3 + 40 * 10 + 30 * 9 + 10 * 6  # every tensor listed once
    assert got == want
    assert sum(t == "Q6_K" for t in got.values()) == 1 + 3 * 20  # output + 20 use_more_bits layers × 3


@pytest.mark.slow
def test_smoke_pair_loads_in_the_runtime_with_the_dspark_coupling(tok_dir, tmp_path):
    from llama_cpp import Llama

    from ggufbridge.runtime.artifacts import load_artifacts

    assert mf.main([str(tmp_path), "--tokenizer", str(tok_dir), "--smoke"]) == 0
    art = load_artifacts(tmp_path, verify_hashes=True)  # manifest sizes and the writer's hashes hold
    llm = Llama(str(art.target.path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval([9707, 1879, 11, 1246])
    logits = np.array(llm.scores[:4])
    assert logits.shape == (4, 248144) and np.isfinite(logits).all() and logits.std() > 0.1
    kv = {f.name: f for f in GGUFReader(str(art.draft.path)).fields.values()}

    def val(key):
        f = kv[key]
        return [f.parts[i].tolist()[0] for i in f.data]

    s = mf.SMOKE
    assert val("dflash.target_layers") == [t + 1 for t in s.d_taps]
    assert val("dflash.block_size") == [s.d_block]
    assert val("tokenizer.ggml.mask_token_id") == [s.d_mask]
    assert {"markov_w1.weight", "conf_proj.weight"} <= set(_types(art.draft.path))
