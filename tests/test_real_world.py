"""Real files from public model repositories (tests/data/real-world/; sources.json records each one's repository,
path, commit and licence note) through the readers the converter uses: every one is accepted. Where a real file can
stand in one of the synthetic checkpoint's own (tokenizer and generation configs, special tokens map, chat template,
processor configs), the checkpoint converts with it.

Issue 40: transformers writes `"model_max_length": 1000000000000000019884624838656` (int(1e30)) for a tokenizer
without a length limit, and the JSON reader refused every such checkpoint because it bounded every number of every
document. The reader now bounds only what a parser cannot survive; the fields the converter reads are judged where
they are read (tests/test_hostile_inputs.py, section 8). New bounds are checked against this corpus before they land.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from ggufbridge.checkpoint import model_dir
from ggufbridge.errors import TokenizerError
from ggufbridge.ggufio import tokenizer
from ggufbridge.textfile import read_utf8

CORPUS = Path(__file__).parent / "data" / "real-world"
SOURCES = json.loads((CORPUS / "sources.json").read_text())["files"]
INT_1E30 = int(1e30)  # 1000000000000000019884624838656: transformers' VERY_LARGE_INTEGER

# the real files that stand in the synthetic checkpoint's own in the conversions below
QWEN35_TOKENIZER_CONFIG = "lawrence3699__Jev-Style-Qwen3.5-2B-Decision-MLX-bf16/tokenizer_config.json"
QWEN36_TEMPLATE = "w32zhong__qwen3.6-fp8-config-fix/chat_template.jinja"
QWEN35_MOE_CONFIG = "bryce-hoehn__Qwen3.5-18B-REAP-A3B-Coding/config.json"
STAND_INS = {  # name in the checkpoint -> corpus file
    "generation_config.json": "hualayn__ai-articles/generation_config.json",
    "processor_config.json": "hualayn__ai-articles/processor_config.json",
    "video_preprocessor_config.json": "hualayn__ai-articles/video_preprocessor_config.json",
    "special_tokens_map.json": "NaiveAI-Labs__Naive-N0.5-Flash/special_tokens_map.json",
}


def _kind(rel: str) -> str:
    name = Path(rel).name
    if name.endswith(".safetensors.index.json"):
        return "index"
    if name.endswith(".jinja") or name == "chat_template.json":
        return "chat template"
    return name


def _read(rel: str):
    """The file through the reader the converter uses for its kind."""
    path = CORPUS / rel
    kind = _kind(rel)
    if kind == "chat template" and path.suffix == ".jinja":
        return read_utf8(path, TokenizerError)
    if kind == "tokenizer_config.json":
        return tokenizer._load(path)  # tokenizer files: the bounded reader, TokenizerError
    return model_dir.load_json(path, "a real file")  # config.json, the index, processor configs: ConfigError


def test_the_corpus_is_recorded_and_covers_every_kind():
    on_disk = sorted(p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
                     if p.is_file() and p.name != "sources.json")
    assert on_disk == sorted(e["file"] for e in SOURCES)
    assert len(on_disk) >= 150
    for e in SOURCES:
        assert re.fullmatch(r"[0-9a-f]{40}", e["commit"]), e
        assert e["repository"].startswith("https://github.com/") and e["path"], e
        assert e["file"].endswith(e["path"].rsplit("/", 1)[-1]), e
    kinds = Counter(_kind(e["file"]) for e in SOURCES)
    wanted = {"config.json": 20, "tokenizer_config.json": 15, "generation_config.json": 20,
              "special_tokens_map.json": 10, "preprocessor_config.json": 5, "chat template": 3}
    assert all(kinds[k] >= n for k, n in wanted.items()), kinds
    assert kinds["processor_config.json"] + kinds["index"] >= 2, kinds
    # the value of issue 40, as transformers itself writes it, in several real tokenizer configs
    huge = [e["file"] for e in SOURCES if _kind(e["file"]) == "tokenizer_config.json"
            and json.loads((CORPUS / e["file"]).read_text()).get("model_max_length") == INT_1E30]
    assert len(huge) >= 3, huge
    assert '"model_max_length": 1000000000000000019884624838656' in (CORPUS / huge[0]).read_text()


@pytest.mark.parametrize("rel", [e["file"] for e in SOURCES])
def test_every_real_file_is_accepted_by_the_converters_reader(rel):
    value = _read(rel)
    if _kind(rel) == "chat template" and rel.endswith(".jinja"):
        assert isinstance(value, str) and value.strip()
    else:
        assert isinstance(value, dict) and value


def test_a_real_qwen35_moe_config_passes_the_field_checks():
    """The fields the converter reads from a real Qwen3.5-MoE text config, judged where they are read."""
    from ggufbridge.arch.config import Cfg
    from ggufbridge.arch.qwen35moe import TextParams

    p = TextParams.read(Cfg(_read(QWEN35_MOE_CONFIG)))
    assert (p.n_layer, p.n_expert, p.n_expert_used, p.ctx_len, p.rope_theta) == (40, 128, 8, 262144, 1e7)
    assert p.n_rot == 64 and p.sections == (11, 11, 10, 0) and p.mtp_layers == 1


def test_real_processor_configs_give_the_video_settings(tmp_path):
    """transformers' lookup (processor_config.json's video_processor, then video_preprocessor_config.json): a
    Qwen3-VL style processor names none of MiniCPM-V's settings, so the defaults hold."""
    from ggufbridge.arch.minicpmv4_7_vision import read_video_settings

    for name, rel in STAND_INS.items():
        shutil.copyfile(CORPUS / rel, tmp_path / name)
    md = SimpleNamespace(file=lambda n: tmp_path / n if (tmp_path / n).is_file() else None)
    assert read_video_settings(md) == {"max_num_frames": 128, "stack_frames": 1}


# --- the synthetic checkpoint with real files in it -----------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(make_ckpt):
    return make_ckpt("tiny", vocab="small")


def _own_copy(src: Path, dst: Path) -> Path:
    """A copy whose small files may be replaced; the shards are linked (never written)."""
    dst.mkdir()
    for p in src.iterdir():
        if p.suffix == ".safetensors":
            (dst / p.name).hardlink_to(p)
        else:
            shutil.copy2(p, dst / p.name)
    return dst


def _ggufs(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.gguf"))}


def test_model_max_length_int_1e30_converts_to_the_same_gguf(ckpt, tmp_path):
    """The acceptance of issue 40: a checkpoint whose tokenizer_config.json says int(1e30) converts, to the same
    GGUF as the one saying 262144 (the converter never reads the value)."""
    from ggufbridge.convert import convert

    assert json.loads((ckpt / "tokenizer_config.json").read_text())["model_max_length"] == 262144
    unlimited = _own_copy(ckpt, tmp_path / "unlimited")
    cfg = json.loads((unlimited / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = INT_1E30
    (unlimited / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    assert '"model_max_length": 1000000000000000019884624838656' in (unlimited / "tokenizer_config.json").read_text()
    convert(ckpt, tmp_path / "a", outtype="f32", progress=False, mmproj=False)
    convert(unlimited, tmp_path / "b", outtype="f32", progress=False, mmproj=False)
    a, b = _ggufs(tmp_path / "a"), _ggufs(tmp_path / "b")
    assert a and a == b


def test_real_files_stand_in_the_checkpoints_own(ckpt, tmp_path):
    """A real Qwen3.5 tokenizer_config.json, Qwen3.6 chat template, generation config, special tokens map and
    Qwen3-VL processor configs in the synthetic checkpoint: it converts, and the GGUF carries what they say."""
    from ggufbridge.convert import convert
    from ggufbridge.ggufio.reader import read_header

    d = _own_copy(ckpt, tmp_path / "ckpt")
    for name, rel in {**STAND_INS, "tokenizer_config.json": QWEN35_TOKENIZER_CONFIG,
                      "chat_template.jinja": QWEN36_TEMPLATE}.items():
        (d / name).unlink(missing_ok=True)
        shutil.copyfile(CORPUS / rel, d / name)
    out = tmp_path / "out"
    convert(d, out, outtype="f32", progress=False)
    target = next(p for p in out.glob("*.gguf") if "mmproj" not in p.name)
    kv = read_header(target).kv
    template = kv["tokenizer.chat_template"]
    assert template == (CORPUS / QWEN36_TEMPLATE).read_text(encoding="utf-8")
    tokens = kv["tokenizer.ggml.tokens"]
    # the real config names <|endoftext|> as both eos and pad (the fixture's own says <|im_end|> for eos)
    assert tokens[kv["tokenizer.ggml.eos_token_id"]] == "<|endoftext|>"
    assert tokens[kv["tokenizer.ggml.padding_token_id"]] == "<|endoftext|>"
    assert any("mmproj" in p.name for p in out.glob("*.gguf"))
