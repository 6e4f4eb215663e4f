"""Every tensor name and metadata key the converters plan is one gguf-py knows (gguf.MODEL_TENSORS / gguf.Keys)
or one of the few in ggufbridge.ggufio.names' local table of what gguf 0.19 lacks. A misspelt name would otherwise
be found only when llama.cpp loads the file (or, for an optional tensor, never)."""

from __future__ import annotations

import gguf
import pytest

from ggufbridge.checkpoint.model_dir import ModelDir
from ggufbridge.convert import plan_outputs
from ggufbridge.testkit import dspark as fx
from ggufbridge.ggufio import names

SUFFIXES = (".weight", ".bias")


def _stem(name: str) -> str:
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


@pytest.fixture(scope="module")
def outputs(make_ckpt, tmp_path_factory):
    target = make_ckpt("tiny", vocab="small")
    draft = fx.make_dspark(tmp_path_factory.mktemp("names") / "draft", target, "tiny")
    return {o.role: o.plan for o in plan_outputs(ModelDir.open(target), outtype="f32", basename=None, draft=draft)}


def _layers(plan) -> int:
    return 1 + max((int(t.name.split(".")[1]) for t in plan.tensors if t.name.startswith("blk.")), default=0)


def test_target_tensors_are_gguf_qwen35moe_tensors(outputs):
    plan = outputs["target"]
    assert plan.arch == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN35MOE]
    known = names.known_tensor_names(gguf.MODEL_ARCH.QWEN35MOE, _layers(plan))
    unknown = sorted(t.name for t in plan.tensors if _stem(t.name) not in known)
    assert not unknown, f"planned target tensors gguf's MODEL_TENSORS[QWEN35MOE] does not list: {unknown[:5]}"
    # and the check can fail: a misspelt name is caught
    assert _stem("blk.0.attn_qkvv.weight") not in known


def test_target_keys_are_gguf_keys(outputs):
    plan = outputs["target"]
    local = {names.key(names.RECURRENT_LAYERS, plan.arch)}
    unknown = sorted({kv.key for kv in plan.kvs} - names.known_keys(plan.arch) - local)
    assert not unknown, f"planned target keys gguf.Keys does not define: {unknown}"


def test_mmproj_names_and_keys(outputs):
    plan = outputs["mmproj"]
    known = names.known_tensor_names(gguf.MODEL_ARCH.MMPROJ, _vision_layers(plan))
    local = {names.VIT_MERGER + t for t in names.VIT_MERGER_TENSORS}
    unknown = sorted(t.name for t in plan.tensors if _stem(t.name) not in known | local)
    assert not unknown, f"planned mmproj tensors neither gguf nor the local table lists: {unknown[:5]}"
    assert any(_stem(t.name) in local for t in plan.tensors)  # the 16x plan has the window merger
    unknown = sorted({kv.key for kv in plan.kvs} - names.known_keys(plan.arch) - set(names.MINICPMV_KEYS))
    assert not unknown, f"planned mmproj keys neither gguf.Keys nor the local table defines: {unknown}"


def _vision_layers(plan) -> int:
    return 1 + max(int(t.name.split(".")[2]) for t in plan.tensors if t.name.startswith("v.blk."))


def test_draft_names_and_keys(outputs):
    plan = outputs["draft"]
    assert plan.arch == names.DFLASH_ARCH
    generic = {n.format(bid=i) if "{bid}" in n else n for n in gguf.TENSOR_NAMES.values() for i in range(_layers(plan))}
    unknown = sorted(t.name for t in plan.tensors if _stem(t.name) not in generic | set(names.DFLASH_TENSORS))
    assert not unknown, f"planned draft tensors neither gguf nor the local table lists: {unknown[:5]}"
    local = {names.key(k, plan.arch) for k in names.DFLASH_KEYS}
    unknown = sorted({kv.key for kv in plan.kvs} - names.known_keys(plan.arch) - local)
    assert not unknown, f"planned draft keys neither gguf.Keys nor the local table defines: {unknown}"
