"""ggufbridge.testkit.fullsize (`python -m benchmarks.make_fullsize_gguf`): the random-weight full-shape GGUFs behind
the H200 measurements (issue 8).

References: gguf-py's dequantiser for the hand-built blocks, llama-quantize's own --dry-run for the Q4_K_M type
choices, and the pinned runtime (bindings) for loading the files. The files carry the real 248,144-entry vocabulary,
so they are read back with ggufbridge's header reader (checked against gguf-py's GGUFReader in test_ggufio), not
GGUFReader itself, which spends ~12 s per file on the vocabulary's metadata before the first tensor.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from ggufbridge.ggufio.reader import read_header
from ggufbridge.testkit import fullsize as mf
from _cores import THREADS



@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from ggufbridge.testkit.vocab import write_tokenizer

    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d, "qwen35")
    return d


@pytest.mark.parametrize("qtype, tol", [("Q4_K", 0.15), ("Q6_K", 0.15), ("Q8_0", 0.15), ("Q4_0", 0.15),
                                        ("Q5_K", 0.15), ("BF16", 0.15), ("Q3_K", 0.35)])
def test_blocks_dequantize_to_centred_weights_of_the_intended_scale(qtype, tol):
    # Q3_K's 6-bit scales are random (signed, not centred on a fixed value), so its spread is looser
    pool = mf.BlockPool(qtype, 512 * 256 // mf.QK[qtype], np.random.default_rng(0))
    raw = pool.take(256 * 512, mf.QK[qtype])
    w = gguf_quants.dequantize(raw.reshape(512, -1), GGMLQuantizationType[qtype]).astype(np.float64)
    assert w.shape == (512, 256) and np.isfinite(w).all()
    assert abs(w.mean()) < 0.05 * mf.WEIGHT_STD
    assert (1 - tol) * mf.WEIGHT_STD < w.std() < (1 + tol) * mf.WEIGHT_STD
    # consecutive takes are different runs of the pool (tensors do not all share one block)
    assert not np.array_equal(pool.take(256 * 8, mf.QK[qtype]), pool.take(256 * 8, mf.QK[qtype]))


def _types(path: Path) -> dict[str, str]:
    return {t.name: t.type for t in read_header(path).tensors}


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
    llm = Llama(str(art.target.path), n_ctx=64, n_threads=THREADS, logits_all=True, verbose=False)
    llm.eval([9707, 1879, 11, 1246])
    logits = np.array(llm.scores[:4])
    assert logits.shape == (4, 248144) and np.isfinite(logits).all() and logits.std() > 0.1
    kv = read_header(art.draft.path).kv
    s = mf.SMOKE
    assert list(kv["dflash.target_layers"]) == [t + 1 for t in s.d_taps]
    assert kv["dflash.block_size"] == s.d_block
    assert kv["tokenizer.ggml.mask_token_id"] == s.d_mask
    assert {"markov_w1.weight", "conf_proj.weight"} <= set(_types(art.draft.path))


def test_oracle_pair_maps_each_token_to_its_successor_and_drafts_at_the_set_rate(tok_dir, tmp_path):
    """--oracle: dequantised from the written files, the target's head applied to a token's embedding picks
    succ(t), and the draft's Markov head proposes succ(t) except at every period-th token of each cycle."""
    assert mf.main([str(tmp_path), "--tokenizer", str(tok_dir), "--smoke", "--oracle"]) == 0
    o = mf.Oracle(length=8, periods=(1, 2, 4, 0))
    t, d = read_header(tmp_path / "target.gguf"), read_header(tmp_path / "draft.gguf")

    def deq(h, name, rows=None):
        """The tensor dequantised (numpy order); `rows`: only those rows of the outermost axis (the vocabulary's:
        the cycles' 32 tokens, not 248k rows of gguf-py's Python dequantiser)."""
        x = h.tensor(name)
        blocks = h.tensor_blocks(x)
        shape = x.shape[::-1]
        if rows is not None:
            blocks, shape = blocks[rows], (len(rows), *shape[1:])
        return gguf_quants.dequantize(np.asarray(blocks), GGMLQuantizationType[x.type]).reshape(shape)

    toks = sorted({tok for cycle in o.cycles() for tok in cycle})
    emb, head = dict(zip(toks, deq(t, "token_embd.weight", toks))), deq(t, "output.weight")
    w1, w2 = dict(zip(toks, deq(d, "markov_w1.weight", toks))), deq(d, "markov_w2.weight")
    for name in ("blk.0.ssm_out.weight", "blk.3.attn_output.weight", "blk.1.ffn_down_exps.weight"):
        assert not deq(t, name).any(), name  # the layers write nothing to the residual stream
    wrong = 0
    for c, period in enumerate(o.periods):
        for i, tok in enumerate(o.cycles()[c]):
            assert int(np.argmax(head @ emb[tok])) == o.succ(tok)
            proposal = int(np.argmax(w2 @ w1[tok]))
            assert proposal == o.proposal(tok)
            wrong += proposal != o.succ(tok)
    assert wrong == 8 + 4 + 2  # periods 1, 2, 4 over 8-token cycles; period 0 never
