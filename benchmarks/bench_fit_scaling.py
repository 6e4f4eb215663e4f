"""How `quantize --fit-bytes` scales with the model: the command's printed estimate against its measured time on
random-weight models with the 35B-A3B's real layer shapes, a few layers deep, each beside one plain
`quantize --quant Q4_K_M` of the same file; then the fitted law evaluated at the full 35B-A3B.

    python -m benchmarks.bench_fit_scaling --work /tmp/fit-scaling [--layers 2 4 10] [--experts 16]
        [--vocab real|small] [--tokens 4096] [--threads 2] [--out benchmarks/results/fit-scaling/cpu.json]

Models: benchmarks/make_fullsize_gguf.py's target at BF16 (hidden 2048, 16/2 heads of 256, gated delta-net
16 K-heads / 32 V-heads of 128, shared and routed expert ff 512, layers in the LLLF pattern, the real
248,144-token vocabulary or the test kit's 512), with `--experts` routed experts (top-8) instead of 256: an
expert layer of 256 is 1.6 GB of BF16, too much for a small machine three times over. A model needs a layer of
each kind (the runtime's hybrid memory asserts on a KV cache or a recurrent state without layers), so the
smallest is 2 layers, LF. A token still runs 8 experts per layer, so the pass per token is the real one; what
256 experts add (more weights to quantise, more bytes to copy and map) is linear in the weights and bytes, and
the law counts them that way.

Each size runs the real CLI in a child process (wall time from the parent, which includes the interpreter's
start), with `--ctx 0` and a budget of the Q4_K_M file's size. The estimate is the one the command printed
(also stored in sensitivity.json's timings). The law: a llama.cpp pass = load + tokens × (head + layers ×
per-layer) seconds, quantisation = weights × seconds per weight, copies = bytes × seconds per byte, each fitted
on the sizes' calibration figures (least squares), then evaluated with the 35B-A3B's counts: 192 units, its
weights and bytes, 4,096 calibration tokens (the default 16 rows of 256).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PATTERN = "LLLF" * 10
CLI_FLAGS: list[str] = []  # ["-v"] with --verbose: llama.cpp's own log lines land in each size's logs


def build(work: Path, layers: int, experts: int, vocab: str, seed: int = 0) -> Path:
    from ggufbridge.testkit.fullsize import Shape, target_plan

    from ggufbridge.ggufio.tokenizer import read_vocab
    from ggufbridge.ggufio.writer import write_gguf
    from ggufbridge.testkit.vocab import write_tokenizer

    out = work / f"L{layers}-E{experts}-{vocab}" / "src-BF16.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = work / f"tokenizer-{vocab}"
    name = "qwen35" if vocab == "real" else vocab
    if not (tok / "tokenizer.json").is_file():
        write_tokenizer(tok, name)
    from ggufbridge.testkit.vocab import get_vocab

    pattern = PATTERN[:layers] if "F" in PATTERN[:layers] else PATTERN[:layers - 1] + "F"
    s = replace(Shape(), layers=pattern, experts=experts, top_k=min(8, experts),
                vocab=get_vocab(name).vocab_size)
    plan = target_plan(s, "bf16", read_vocab(tok, s.vocab), seed)
    w = write_gguf(plan, out, "f16")
    w.commit()
    return out


def run(argv: list[str], log: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ggufbridge", *CLI_FLAGS, *argv], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
    dt = time.perf_counter() - t0
    log.write_text(p.stdout + p.stderr)
    if p.returncode:
        raise SystemExit(f"{' '.join(argv[:3])}... failed ({p.returncode}); see {log}")
    return dt, p.stderr


def real_counts() -> dict:
    """Units, quantisable weights and BF16 bytes of the real 35B-A3B (its shapes, no weights)."""
    from ggufbridge.testkit.fullsize import Shape, _FakeRefs

    from ggufbridge.arch import qwen35moe as qm
    from ggufbridge.ggufio.plan import ConversionPlan
    from ggufbridge.quant.sensitivity import ERROR_SAMPLE, _sample_plan, unit_of

    s = Shape()
    p = s.text_params()
    plan = ConversionPlan(qm.ARCH)
    qm.plan_text(plan, p, _FakeRefs(p), "", "lm_head.weight")
    units, weights, elements, sampled = set(), 0, 0, 0
    for t in plan.tensors:
        n = int(np.prod(t.shape))
        elements += n
        if unit_of(t.name):
            units.add(unit_of(t.name))
            weights += n
            g = tuple(reversed(t.shape))  # ggml order
            sampled += n if n <= ERROR_SAMPLE else sum(len(range(g[1])[r]) * g[0] for _, r in _sample_plan(
                g, ERROR_SAMPLE))
    return {"units": len(units), "weights": weights, "sampled": sampled, "bf16_bytes": 2 * elements,
            "layers": len(s.layers)}


def fit(rows: list[dict]) -> dict:
    """Least-squares law from the sizes' calibration figures."""
    L = np.array([r["layers"] for r in rows], float)
    tok = np.array([r["cost"]["token_s"] for r in rows])
    b, a = np.polyfit(L, tok, 1) if len(rows) > 1 else (0.0, tok[0])
    by = np.array([r["cost"]["source_bytes"] for r in rows], float)
    ld = np.array([r["cost"]["load_s"] for r in rows])
    d, c = np.polyfit(by, ld, 1) if len(rows) > 1 else (0.0, ld[0])
    return {"token_s_head": float(a), "token_s_per_layer": float(max(b, 0.0)), "load_s_fixed": float(c),
            "load_s_per_byte": float(max(d, 0.0)),
            "element_s": float(np.mean([r["cost"]["element_s"] for r in rows])),
            "probe_element_s": float(np.mean([r["cost"]["probe_element_s"] for r in rows])),
            "byte_s": float(np.mean([r["cost"]["byte_s"] for r in rows])),
            # resident probes (runs since the runtime can write a loaded weight): per-probe writes, the final step
            **{k: float(np.mean([r["cost"][k] for r in rows])) for k in ("final_element_s", "set_byte_s",
                                                                          "swap_element_s")
               if all(r["cost"].get(k) is not None for r in rows)},
            "resident": all(r["cost"].get("resident") for r in rows)}


def full_size(law: dict, counts: dict, tokens: int = 4096, types: int = 8) -> dict:
    from ggufbridge.quant.cost import CostModel

    m = CostModel(units=counts["units"], rows=tokens // 256, tokens=tokens, elements=counts["weights"],
                  sampled=counts["sampled"], types=types, source_bytes=counts["bf16_bytes"],
                  probe_element_s=law["probe_element_s"],
                  load_s=law["load_s_fixed"] + law["load_s_per_byte"] * counts["bf16_bytes"],
                  token_s=law["token_s_head"] + law["token_s_per_layer"] * counts["layers"],
                  element_s=law["element_s"], byte_s=law["byte_s"], reference_passes=1,
                  final_element_s=law.get("final_element_s"), resident=law.get("resident", False),
                  unit_bytes=2 * counts["weights"], set_byte_s=law.get("set_byte_s", 0.0),
                  swap_element_s=law.get("swap_element_s", 0.0))
    return {"total_s": m.total(), "parts_s": m.parts(), "pass_s": m.pass_s(), "load_s": m.load_s,
            "token_s": m.token_s}


def _gpu() -> str | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    except OSError:
        return None
    return p.stdout.strip() or None if p.returncode == 0 else None


def save(a, rows: list[dict]):
    """The rows so far, the law fitted on them and its full-size estimate, written after every size."""
    law = fit([r for r in rows if r.get("probes", "auto") == a.probes[0]] or rows)
    counts = real_counts()
    full = full_size(law, counts)
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "gpu": _gpu()},
           "experts": a.experts, "threads": a.threads, "rows": rows, "law": law,
           "full_35b": {"counts": counts, "estimate": full}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".part")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    os.replace(tmp, a.out)
    return law, full, counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4, 10])
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--vocab", choices=("real", "small"), default="real",
                    help="the 248,144-token vocabulary, or the test kit's 512 (the head's cost then comes from --head)")
    ap.add_argument("--tokens", type=int, default=None, help="--calibration-tokens of each run [all: 4,096]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fit-scaling" / "cpu.json")
    ap.add_argument("--verbose", action="store_true", help="run the commands with -v (llama.cpp's log in the logs)")
    ap.add_argument("--drop-sources", action="store_true",
                    help="delete a size's source GGUF once it is measured (a device's 64 GB disk holds 2+4+6+10 "
                         "layers' sources only barely; kept by default to be reused by the next run)")
    ap.add_argument("--probes", nargs="+", choices=("auto", "resident", "layout"), default=["auto"],
                    help="--fit-probes of each run; several: each size once per mode, in the same call (an A/B); "
                         "the law is fitted on the first")
    a = ap.parse_args(argv)
    if a.verbose:
        CLI_FLAGS.append("-v")
    from ggufbridge.quant.optimise import default_calibration

    a.work.mkdir(parents=True, exist_ok=True)
    cal = default_calibration()
    # sizes measured by an earlier call into the same --out (a device call is limited to minutes: one size a call)
    same = {"experts": a.experts, "threads": a.threads}
    rows = []
    if a.out.is_file():
        old = json.loads(a.out.read_text())
        if all(old.get(k) == v for k, v in same.items()):
            rows = [r for r in old["rows"] if (r["layers"], r.get("probes", "auto")) not in
                    {(n, m) for n in a.layers for m in a.probes}]
    q4_times: dict[int, float] = {}
    for layers, mode in [(n, m) for n in a.layers for m in a.probes]:
        src = build(a.work, layers, a.experts, a.vocab)
        d = src.parent
        q4, q4_time = d / "Q4_K_M.gguf", d / "Q4_K_M.time.json"
        if (layers not in q4_times or not q4.is_file()) and q4.is_file() and q4_time.is_file():
            # made by an earlier call that a device's time limit cut during the --fit-bytes run: kept, not redone
            q4_times[layers] = json.loads(q4_time.read_text())["s"]
        if layers not in q4_times or not q4.is_file():  # once per size: the next mode reuses it
            q4_times[layers], _ = run(["quantize", str(src), "-o", str(q4), "--quant", "Q4_K_M", "--threads",
                                       str(a.threads)], d / "q4.log")
            q4_time.write_text(json.dumps({"s": q4_times[layers]}))
        q4_s = q4_times[layers]
        work = d / "sens"
        if work.exists():
            shutil.rmtree(work)  # measured from scratch every time
        load = os.getloadavg()
        fit_s, err = run(["quantize", str(src), "-o", str(d / "fit.gguf"), "--fit-bytes", str(q4.stat().st_size),
                          "--ctx", "0", "--calibration", str(cal), "--work", str(work), "--threads",
                          str(a.threads), "--fit-probes", mode]
                         + (["--calibration-tokens", str(a.tokens)] if a.tokens else []), d / f"fit-{mode}.log")
        sens = json.loads(next(work.glob("*/sensitivity.json")).read_text())
        est = sens["timings"]["estimate_s"]
        printed = re.search(r"estimated total\s+(\S+ \S+)", err)
        row = {"layers": layers, "probes": mode, "resident": sens["timings"].get("resident", False),
               "experts": a.experts, "source_bytes": src.stat().st_size,
               "units": len(sens["units"]), "tokens": sens["n_tokens"], "quantize_q4_k_m_s": q4_s,
               "fit_bytes_s": fit_s, "estimate_s": est, "printed": printed.group(1) if printed else None,
               "ratio": fit_s / est, "timings": sens["timings"], "cost": sens["timings"]["cost"],
               "loadavg_before": load, "loadavg_after": os.getloadavg()}
        rows.append(row)
        print(f"L={layers} ({mode}): {row['units']} units, {row['source_bytes'] / 1e9:.2f} GB; quantize Q4_K_M "
              f"{q4_s:.0f} s; "
              f"--fit-bytes {fit_s:.0f} s, estimate {est:.0f} s (measured/estimate {row['ratio']:.2f}); "
              f"load {load[0]:.1f}", flush=True)
        (d / "fit.gguf").unlink(missing_ok=True)
        if mode == a.probes[-1]:
            q4.unlink(missing_ok=True)
            q4_time.unlink(missing_ok=True)
            if a.drop_sources:
                src.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)  # the next size needs the disk (a device has 64 GB)
        rows.sort(key=lambda r: (r["layers"], r.get("probes", "auto")))
        law, full, counts = save(a, rows)
    print(f"law: {law}")
    print(f"35B-A3B ({counts['units']} units, {counts['weights'] / 1e9:.1f} B weights, "
          f"{counts['bf16_bytes'] / 1e9:.0f} GB BF16), 4,096 calibration tokens, this machine: "
          f"{full['total_s'] / 3600:.1f} h {dict((k, round(v)) for k, v in full['parts_s'].items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
