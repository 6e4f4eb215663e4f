"""Target-only vs drafted decoding through a real llama-server, per prompt length.

Each mode gets its own server (same settings, same context); every request is greedy, ignores EOS, does not
reuse the prompt cache, and sends the prompt as token ids so its length is exact. Speeds and draft counts
are the server's own (`timings` of the final streamed chunk; `/metrics` counters cross-check acceptance);
time to first token is measured by the client from request start to the first streamed token.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufbridge.errors import GGUFBridgeError, RuntimeNotFound
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.artifacts import ModelSpec, home_of
from ggufbridge.runtime.session import prepare
from ggufbridge.untrusted import parse_json

# filler for synthetic prompts: plain prose, tokenised by the server itself, repeated as needed
_FILLER = ("The river wound through the valley, past orchards and stone bridges, while the old miller counted "
           "sacks of grain and told stories about the winter when the water froze solid. ")


MAX_PROMPT_TOKENS = 1 << 21  # 8× the model's 262,144-token context


def parse_lengths(text: str) -> list[int]:
    """"512,1k,2k" -> [512, 1024, 2048] (k = 1024, as the published measurements use)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        m = re.fullmatch(r"(\d+)(k?)", part)
        if not m or int(m.group(1)) == 0 or len(m.group(1)) > 9:
            raise GGUFBridgeError(f"--prompt-lengths: expected positive integers or NNk, found {part[:20]!r}")
        n = int(m.group(1)) * (1024 if m.group(2) else 1)
        if n > MAX_PROMPT_TOKENS:  # each prompt is built in memory before the server sees it
            raise GGUFBridgeError(f"--prompt-lengths: {n} tokens is more than the limit of {MAX_PROMPT_TOKENS}")
        out.append(n)
    if len(set(out)) != len(out):
        raise GGUFBridgeError(f"--prompt-lengths: duplicate lengths in {text!r}")
    return sorted(out)


def load_prompts(path: str | Path) -> list[str]:
    """The user's prompts: a JSONL file, one JSON string or {"prompt": "..."} object per line."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise GGUFBridgeError(f"--prompts: cannot read {path}: {e}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        v = parse_json(line, f"--prompts {path}:{i}", GGUFBridgeError)
        if isinstance(v, dict):
            v = v.get("prompt")
        if not isinstance(v, str) or not v:
            raise GGUFBridgeError(f"--prompts {path}:{i}: expected a non-empty prompt string, found {v!r}")
        out.append(v)
    if not out:
        raise GGUFBridgeError(f"--prompts: {path} holds no prompts")
    return out


def parse_n_max(text: str, top: int) -> list[int]:
    """"2,4,8" -> [2, 4, 8]: draft lengths to compare, each in 1..top."""
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise GGUFBridgeError(f"--draft-n-max: expected comma-separated integers, found {text!r}") from None
    if not out or out[0] < 1 or out[-1] > top:
        raise GGUFBridgeError(f"--draft-n-max: expected integers in 1..{top}, found {text!r}")
    return out


@dataclass
class Sample:
    mode: str  # "target" | "draft"
    prompt_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    ttft_s: float
    predicted: int
    draft_n: int | None
    draft_accepted: int | None
    text: str = field(repr=False)  # the streamed text; the stream's per-chunk token lists are incomplete
    prompt: int | None = None  # index into the user's prompts (--prompts), else None

    @property
    def acceptance(self) -> float | None:
        return self.draft_accepted / self.draft_n if self.draft_n else None


def prompt_ids(url: str, n: int, api_key: str | None = None) -> list[int]:
    text = _FILLER
    while True:
        ids = sv.tokenize(url, text, api_key)
        if len(ids) >= n:
            return ids[:n]
        text *= 2


def run_mode(mode: str, argv: list[str], host: str, port: int, log: Path, env: dict, lengths: list[int],
             n_predict: int, repeats: int, timeout: float, prompts: list[str] | None = None,
             on_sample: Callable[[], None] | None = None) -> tuple[list[Sample], dict]:
    """Synthetic prompts of each length, or the user's `prompts` (then `lengths` is ignored); `on_sample()` is
    called after each request."""
    samples = []
    with sv.Server(argv, host, port, log, env=env) as srv:
        srv.wait_ready(timeout)
        url = srv.url
        sv.complete_stream(url, prompt_ids(url, 8), 4)  # warm-up: first-call allocations out of the measurement
        before = sv.metrics(url)
        jobs = [(i, p) for i, p in enumerate(prompts)] if prompts else [(None, prompt_ids(url, n)) for n in lengths]
        for index, prompt in jobs:
            for _ in range(repeats):
                ttft, text, t = sv.complete_stream(url, prompt, n_predict)
                samples.append(Sample(
                    mode=mode, prompt_tokens=t.get("prompt_n", len(prompt)), prefill_tok_s=t["prompt_per_second"],
                    decode_tok_s=t["predicted_per_second"], ttft_s=ttft, predicted=t["predicted_n"],
                    draft_n=t.get("draft_n"), draft_accepted=t.get("draft_n_accepted"), text=text, prompt=index))
                if on_sample is not None:
                    on_sample()
        after = sv.metrics(url)
    counters = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in
                ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                 "spec_decode_num_drafts_total", "tokens_predicted_total")}
    return samples, counters


def context_for(lengths: list[int], prompts: list[str] | None, n_predict: int) -> int:
    """One context for every mode, large enough for the longest prompt plus the answer (a token is >= 1 byte of
    the user's prompts, except for rare byte tokens), rounded up to 256."""
    longest = max(len(p.encode()) for p in prompts) if prompts else lengths[-1]
    return -(-(longest + n_predict + 16) // 256) * 256


def check_context(s, ctx: int, longest: int, n_predict: int, what: str = "--prompt-lengths") -> None:
    """Refuse, before any server starts, lengths that the server would refuse request by request: llama-server
    caps every slot's context at the model's trained context (tools/server/server-context.cpp:4008-4015,
    n_ctx_slot), whatever -c says, and answers a longer request with HTTP 400."""
    limit = s.target.n_ctx_train
    if limit and ctx > limit:
        raise GGUFBridgeError(
            f"{what}: the longest request ({longest} prompt + {n_predict} generated tokens) needs a context of {ctx} "
            f"tokens; {s.art.target.path.name} was trained for {limit} and llama-server caps each slot there: use "
            f"lengths up to {max(limit - (ctx - longest), 0)} tokens")


def default_dir(model) -> Path:
    """Where bench writes by default: MODEL's folder/bench; ./bench for a hub spec."""
    return (home_of(model) or Path.cwd()) / "bench"


def bench(model: "str | Path | ModelSpec", *, prompt_lengths: list[int] = (1024, 2048, 4096, 8192), draft: bool = False,
          draft_n_max: list[int] = (), prompts: list[str] | None = None, recipe: str = "cpu", n_predict: int = 128,
          repeats: int = 1, threads: int | None = None, log_dir: str | Path | None = None,
          llama_bin: str | None = None, timeout: float = 900.0,
          on_command: Callable[[str, str], None] | None = None,
          on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Target-only decoding, and with `draft` the DSpark draft at the recipe's n_max and each of `draft_n_max`,
    each mode on its own llama-server: per prompt length (or per prompt of `prompts`), prefill and decode tok/s,
    time to first token, acceptance, and whether the greedy texts match. Returns the result that
    `write_outputs` writes (bench.json); server logs go to `log_dir` (default `default_dir(model)`). `on_command(mode,
    command)` hears each server's command line before it starts, `on_progress(done, total)` each request measured
    (total: modes x prompts x repeats)."""
    lengths = sorted(prompt_lengths)
    sweep = sorted(set(draft_n_max))
    if sweep and not draft:
        raise GGUFBridgeError("--draft-n-max needs --draft")
    ctx = context_for(lengths, prompts, n_predict)
    # one request at a time: one slot
    s = prepare(model, recipe, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=0, parallel=1)
    check_context(s, ctx, max(len(p.encode()) for p in prompts) if prompts else lengths[-1], n_predict,
                  "--prompts" if prompts else "--prompt-lengths")
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    dest = Path(log_dir) if log_dir else default_dir(model)
    dest.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"
    commands, samples, counters = {}, [], {}
    n_max = {"draft": s.recipe.draft["n_max"]} if draft else {}
    n_max |= {f"draft-{n}": n for n in sweep if n != s.recipe.draft["n_max"]}
    total = (1 + len(n_max)) * (len(prompts) if prompts else len(lengths)) * repeats
    done = [0]

    def one_more():
        done[0] += 1
        if on_progress is not None:
            on_progress(done[0], total)

    for mode in ["target", *n_max]:
        port = sv.free_port(host)
        mode_recipe = dataclasses.replace(s.recipe, draft=dict(s.recipe.draft, n_max=n_max[mode])) \
            if mode in n_max else s.recipe
        opts = sv.ServeOptions(host=host, port=port, draft=mode != "target", threads=threads)
        argv = sv.server_argv(s.rt.bin_dir / "llama-server", mode_recipe, s.plan, s.art, opts)
        commands[mode] = sv.printable(argv)
        if on_command is not None:
            on_command(mode, commands[mode])
        got, counters[mode] = run_mode(mode, argv, host, port, dest / f"llama-server-{mode}.log", s.rt.env(),
                                       lengths, n_predict, repeats, timeout, prompts=prompts, on_sample=one_more)
        samples += got
    if prompts:  # rows by the prompts' own token counts
        lengths = sorted({x.prompt_tokens for x in samples})
    result = {
        "model": s.art.target.path.name, "recipe": s.recipe.name, "ctx": ctx, "n_predict": n_predict,
        "repeats": repeats, "prompt_lengths": lengths,
        "runtime": {"bin": str(s.rt.bin_dir), "commit": s.rt.commit, "version": s.rt.version},
        "commands": commands, "rows": summarize(samples, lengths), "samples": sample_dicts(samples),
    }
    if draft:
        result["draft_counters"] = counters["draft"]
        result["draft_sweep"] = draft_verdict(samples, counters, n_max)
    if prompts:
        result["prompts"] = prompts
    return result


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(samples: list[Sample], lengths: list[int]) -> list[dict]:
    rows = []
    for n in lengths:
        row = {"prompt_tokens": n}
        for mode in ("target", "draft"):
            ss = [s for s in samples if s.mode == mode and s.prompt_tokens == n]
            if not ss:
                continue
            row[mode] = {"prefill_tok_s": _mean([s.prefill_tok_s for s in ss]),
                         "decode_tok_s": _mean([s.decode_tok_s for s in ss]),
                         "ttft_s": _mean([s.ttft_s for s in ss]),
                         "draft_n": sum(s.draft_n or 0 for s in ss) if mode == "draft" else None,
                         "draft_accepted": sum(s.draft_accepted or 0 for s in ss) if mode == "draft" else None}
            if mode == "draft":
                d = row[mode]
                d["acceptance"] = d["draft_accepted"] / d["draft_n"] if d["draft_n"] else None
        tgt = [s.text for s in samples if s.mode == "target" and s.prompt_tokens == n]
        drf = [s.text for s in samples if s.mode == "draft" and s.prompt_tokens == n]
        if tgt and drf:
            row["greedy_identical"] = all(t == tgt[0] for t in tgt + drf)
        rows.append(row)
    return rows


def draft_verdict(samples: list[Sample], counters: dict[str, dict], n_max: dict[str, int]) -> dict:
    """Per drafted mode: decode speed against target-only on the same prompts, acceptance, accepted tokens per
    round (server /metrics); whether drafting pays on this machine and with which n_max."""
    target = _mean([s.decode_tok_s for s in samples if s.mode == "target"])
    rows = []
    for mode, n in sorted(n_max.items(), key=lambda kv: kv[1]):
        ss = [s for s in samples if s.mode == mode]
        c = counters.get(mode, {})
        drafted, accepted = sum(s.draft_n or 0 for s in ss), sum(s.draft_accepted or 0 for s in ss)
        rounds = c.get("spec_decode_num_drafts_total", 0)
        decode = _mean([s.decode_tok_s for s in ss])
        rows.append({"mode": mode, "n_max": n, "decode_tok_s": decode, "speedup": decode / target,
                     "acceptance": accepted / drafted if drafted else None,
                     "accepted_per_round": accepted / rounds if rounds else None})
    best = max(rows, key=lambda r: r["speedup"])
    pays = best["speedup"] > 1.0
    per_round = f"{best['accepted_per_round']:.2f}" if best["accepted_per_round"] is not None else "n/a"
    line = (f"drafting pays on this machine for these prompts: use n_max {best['n_max']} "
            f"({best['speedup']:.2f}x target-only decode, {per_round} accepted tokens per round)" if pays else
            f"drafting does not pay on this machine for these prompts: the best draft length (n_max "
            f"{best['n_max']}) decodes at {best['speedup']:.2f}x target-only ({per_round} accepted tokens per round); "
            f"serve without --draft")
    return {"target_decode_tok_s": target, "rows": rows, "best_n_max": best["n_max"], "pays": pays, "verdict": line}


def markdown(result: dict) -> str:
    has_draft = any("draft" in r for r in result["rows"])
    head = "| prompt tokens | target prefill tok/s | target decode tok/s | target TTFT s |"
    sep = "|---:|---:|---:|---:|"
    if has_draft:
        head += (" draft prefill tok/s | draft decode tok/s | draft TTFT s | acceptance | decode speed-up |"
                 " greedy identical |")
        sep += "---:|---:|---:|---:|---:|:---:|"
    lines = [f"# ggufbridge bench: {result['model']}", "",
             f"runtime: `{result['runtime']['bin']}` commit `{result['runtime']['commit']}`; recipe "
             f"`{result['recipe']}`; context {result['ctx']}; {result['n_predict']} generated tokens per request; "
             f"{result['repeats']} repeat(s)", "", head, sep]
    for r in result["rows"]:
        t = r["target"]
        cells = [f"{r['prompt_tokens']}", f"{t['prefill_tok_s']:.1f}", f"{t['decode_tok_s']:.1f}", f"{t['ttft_s']:.3f}"]
        if has_draft and "draft" in r:
            d = r["draft"]
            acc = f"{d['acceptance']:.1%}" if d["acceptance"] is not None else "n/a"
            cells += [f"{d['prefill_tok_s']:.1f}", f"{d['decode_tok_s']:.1f}", f"{d['ttft_s']:.3f}", acc,
                      f"{d['decode_tok_s'] / t['decode_tok_s']:.2f}x", "yes" if r.get("greedy_identical") else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Commands:", ""] + [f"- {m}: `{c}`" for m, c in result["commands"].items()]
    if "draft_sweep" in result:
        v = result["draft_sweep"]
        lines += ["", "| draft n_max | decode tok/s | vs target-only | acceptance | accepted tokens per round |",
                  "|---:|---:|---:|---:|---:|"]
        for r in v["rows"]:
            acc = f"{r['acceptance']:.1%}" if r["acceptance"] is not None else "n/a"
            per = f"{r['accepted_per_round']:.2f}" if r["accepted_per_round"] is not None else "n/a"
            lines.append(f"| {r['n_max']} | {r['decode_tok_s']:.1f} | {r['speedup']:.2f}x | {acc} | {per} |")
        lines += ["", f"**{v['verdict']}**"]
    if "draft_counters" in result:
        c = result["draft_counters"]
        lines += ["", f"Server /metrics over the drafted run: {int(c['spec_decode_num_draft_tokens_total'])} drafted, "
                      f"{int(c['spec_decode_num_accepted_tokens_total'])} accepted in "
                      f"{int(c['spec_decode_num_drafts_total'])} verification steps."]
    return "\n".join(lines) + "\n"


def tick_label(n: int) -> str:
    """An axis label as the options are written: 1024 -> 1k, 256000 -> 250k (k = 1024), 48 -> 48."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else (f"{n / 1024:.1f}k" if n >= 1024 else str(n))


def two_panel_figure(result: dict, xlabel: str, titles: tuple[str, str], lines: list[tuple]):
    """Two side-by-side panels over a log2 x axis (bench's depths, bench --concurrency's streams), each line
    `(label, style, xs, left ys, right ys)`, titled with the model, recipe and runtime commit. Ticks at the measured
    points, labelled as the options write them (1k, 32k, 250k: not 2^10); one legend below both panels, never over
    a curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    ticks = sorted({x for _, _, xs, _, _ in lines for x in xs})
    for label, style, xs, left, right in lines:
        axes[0].plot(xs, left, style, label=label)
        axes[1].plot(xs, right, style, label=label)
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([tick_label(t) for t in ticks])
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle(f"{result['model']} ({result['recipe']}, commit {result['runtime']['commit']})")
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.07 if handles else 0, 1, 1))
    return fig


def two_panel_plot(result: dict, path: Path, xlabel: str, titles: tuple[str, str], lines: list[tuple]) -> None:
    """`two_panel_figure`, saved to `path`."""
    import matplotlib.pyplot as plt

    fig = two_panel_figure(result, xlabel, titles, lines)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(result: dict, path: Path) -> None:
    rows = result["rows"]
    xs = [r["prompt_tokens"] for r in rows]
    lines = [(mode, style, xs, [r[mode]["decode_tok_s"] for r in rows], [r[mode]["prefill_tok_s"] for r in rows])
             for mode, style in (("target", "o-"), ("draft", "s--")) if all(mode in r for r in rows)]
    two_panel_plot(result, path, "context depth (prompt tokens)", ("decode tok/s", "prefill tok/s"), lines)


def write_outputs(result: dict, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "markdown": out_dir / "bench.md", "plot": out_dir / "bench.png"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n")
    paths["markdown"].write_text(markdown(result))
    plot(result, paths["plot"])
    return paths


def sample_dicts(samples: list[Sample]) -> list[dict]:
    return [asdict(s) | {"acceptance": s.acceptance} for s in samples]
