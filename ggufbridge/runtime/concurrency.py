"""Many clients at once (issue 28): concurrent streaming chat requests through the OpenAI API of a real llama-server.

For each concurrency level c, c clients start together (a barrier) and each streams one greedy chat completion of
its own prompt (`/v1/chat/completions`, `stream: true`, usage in the last chunk). Everything is measured on the
client side, as a client sees it:

* time to first token: request start to the first streamed content;
* per-stream decode tok/s: (completion tokens - 1) / (last content - first content); the first token belongs to
  prefill;
* aggregate decode tok/s: the sum of the per-stream rates of the level (the streams decode at the same time);
  each rate spans its stream's whole decode, so it includes the steps in which the server was still prefilling
  other streams' prompts beside it;
* aggregate while all decode: the tokens all streams of the level generated between the last stream's first
  token and the first stream's last one (counted from the server's running token count in each chunk), over that
  window: the level's steady decode, no prefill in it (none when the window is empty: a stream ended before
  another began);
* output tok/s: all completion tokens of the level over its wall time, prefill included.

Prompts differ per stream (so no slot reuses another's prompt) and are not cached (`cache_prompt: false`); EOS is
ignored so every stream generates exactly `n_predict` tokens. The server's own `timings` of each stream are kept
beside the client's figures. One server per mode (target only, drafted), with as many slots as the highest level,
warmed up by one request of the levels' prompt length before the first level; with repeats, each level runs that
many times and its row is the run with the median aggregate decode (level_row).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufbridge.errors import GGUFBridgeError, ServerError
from ggufbridge.runtime import server as sv

_FILLER = ("Stream {i} asks: the river wound through the valley, past orchards and stone bridges, while the old "
           "miller counted sacks of grain and told stories about the winter when the water froze solid. ")


def parse_levels(text: str) -> list[int]:
    """"1,2,4,8" -> [1, 2, 4, 8]: concurrency levels, each in 1..256 (the most slots a recipe may ask for)."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GGUFBridgeError(f"--concurrency: expected comma-separated integers, found {text!r}") from None
    if not out or min(out) < 1 or max(out) > 256:
        raise GGUFBridgeError(f"--concurrency: expected integers in 1..256, found {text!r}")
    if len(set(out)) != len(out):
        raise GGUFBridgeError(f"--concurrency: duplicate levels in {text!r}")
    return sorted(out)


def percentile(xs: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Stream:
    mode: str            # "target" | "draft"
    level: int           # concurrency level it ran in
    index: int           # its client number in the level
    start_s: float       # request start, seconds since the level started
    first_s: float       # first streamed content
    end_s: float         # last streamed content
    completion_tokens: int
    prompt_tokens: int
    text: str = field(repr=False)
    server: dict = field(default_factory=dict, repr=False)  # the server's timings for this stream
    # (arrival as start_s, tokens generated so far) of each streamed chunk
    progress: list[tuple[float, int]] = field(default_factory=list, repr=False)
    run: int = 0         # which of the level's repeats (--repeats) it ran in

    @property
    def ttft_s(self) -> float:
        return self.first_s - self.start_s

    @property
    def decode_tok_s(self) -> float | None:
        span = self.end_s - self.first_s
        return (self.completion_tokens - 1) / span if self.completion_tokens > 1 and span > 0 else None


def prompt_text(url: str, n: int, i: int, api_key: str | None = None) -> str:
    """Prose of exactly n tokens (by the server's tokenizer) that starts with stream i's own words."""
    text = _FILLER.format(i=i)
    while True:
        status, body = sv.http_json(url + "/tokenize", {"content": text, "add_special": False}, api_key)
        if status != 200 or not isinstance(body, dict):
            raise ServerError(f"/tokenize failed with HTTP {status}: {str(body)[:200]}")
        ids = body["tokens"]
        if len(ids) >= n:
            break
        text *= 2
    status, body = sv.http_json(url + "/detokenize", {"tokens": ids[:n]}, api_key)
    if status != 200 or not isinstance(body, dict):
        raise ServerError(f"/detokenize failed with HTTP {status}: {str(body)[:200]}")
    return body["content"]


def run_level(url: str, mode: str, level: int, prompts: list[str], n_predict: int,
              api_key: str | None = None) -> tuple[list[Stream], float]:
    """`level` clients released together, one streamed request each; (their streams, the level's wall time)."""
    gate = threading.Barrier(level)
    out: list[Stream | BaseException | None] = [None] * level
    t0 = time.perf_counter()

    def client(i: int) -> None:
        try:
            gate.wait()
            progress: list[tuple[float, int]] = []
            start, first, last, text, usage, timings = sv.chat_stream(url, prompts[i], n_predict, t0, api_key,
                                                                      progress=progress)
            if first is None:
                raise ServerError(f"stream {i} of {level} returned no content")
            out[i] = Stream(mode=mode, level=level, index=i, start_s=start, first_s=first, end_s=last,
                            completion_tokens=int(usage.get("completion_tokens", 0)),
                            prompt_tokens=int(usage.get("prompt_tokens", 0)), text=text, server=timings,
                            progress=progress)
        except BaseException as e:  # re-raised in the caller's thread
            out[i] = e

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(level)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for r in out:
        if isinstance(r, BaseException):
            if isinstance(r, (OSError, ValueError)):
                raise ServerError(f"a streamed request failed at concurrency {level}: {r}") from None
            raise r
    return list(out), wall  # type: ignore[arg-type]


def tokens_by(stream: Stream, t: float) -> int:
    """Tokens the stream had generated by time t: the running count of its last chunk that arrived by then."""
    return max((n for at, n in stream.progress if at <= t), default=0)


def steady_decode(streams: list[Stream]) -> tuple[float | None, float]:
    """(tok/s, window s): tokens all streams generated after the last first token, up to the first last one, over
    that window; (None, 0.0) when the window is empty (a stream ended before another began) or holds no token."""
    lo, hi = max(s.first_s for s in streams), min(s.end_s for s in streams)
    if hi <= lo:
        return None, 0.0
    n = sum(tokens_by(s, hi) - tokens_by(s, lo) for s in streams)
    return (n / (hi - lo) if n else None), hi - lo


def summarize_level(streams: list[Stream], wall: float) -> dict:
    """One row of the table: per-stream and aggregate decode tok/s, TTFT p50/p95, output tok/s."""
    rates = [s.decode_tok_s for s in streams]
    ttfts = [s.ttft_s for s in streams]
    tokens = sum(s.completion_tokens for s in streams)
    steady, window = steady_decode(streams)
    return {
        "streams": len(streams),
        "per_stream_decode_tok_s": rates,
        "mean_stream_decode_tok_s": sum(r for r in rates if r) / max(1, sum(1 for r in rates if r)),
        "aggregate_decode_tok_s": sum(r for r in rates if r),
        "steady_decode_tok_s": steady, "steady_window_s": window,
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
        "completion_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall if wall > 0 else None,
        "server_decode_tok_s": [s.server.get("predicted_per_second") for s in streams],
        "draft_n": sum(s.server.get("draft_n", 0) or 0 for s in streams),
        "draft_accepted": sum(s.server.get("draft_n_accepted", 0) or 0 for s in streams),
    }


def level_row(runs: list[dict]) -> dict:
    """One level's row from its repeats' summaries (summarize_level): the run with the median aggregate decode tok/s
    (the lower median for an even count), so that every figure of the row, per-stream rates included, comes from one
    run; each run's aggregate, steady and TTFT p50 beside it, in the order they ran."""
    ranked = sorted(range(len(runs)), key=lambda k: runs[k]["aggregate_decode_tok_s"])
    pick = ranked[(len(runs) - 1) // 2]
    keep = ("aggregate_decode_tok_s", "steady_decode_tok_s", "ttft_p50_s")
    return {**runs[pick], "run": pick, "runs": [{k: r[k] for k in keep} for r in runs]}


def run_mode(mode: str, argv: list[str], host: str, port: int, log: Path, env: dict, levels: list[int],
             prompt_tokens: int, n_predict: int, timeout: float, repeats: int = 1,
             on_level: Callable[[str, int], None] | None = None) -> tuple[list[dict], list[Stream]]:
    """All levels through one server started from `argv` (its -np at least max(levels)), each `repeats` times."""
    rows, streams = [], []
    with sv.Server(argv, host, port, log, env=env) as srv:
        srv.wait_ready(timeout)
        url = srv.url
        prompts = [prompt_text(url, prompt_tokens, i) for i in range(max(levels) + 1)]
        # warm-up with a prompt of the levels' length that no level uses: first-call allocations, the prefill's
        # batch shapes and the first decode steps happen here, not in the one-stream row every ratio is taken to
        sv.chat_stream(url, prompts.pop(), 8, time.perf_counter())
        for level in levels:
            runs = []
            for r in range(repeats):
                got, wall = run_level(url, mode, level, prompts[:level], n_predict)
                for st in got:
                    st.run = r
                streams += got
                runs.append(summarize_level(got, wall))
            rows.append({"mode": mode, **level_row(runs)})
            if on_level is not None:
                on_level(mode, level)
    return rows, streams


def compare_modes(streams: list[Stream]) -> dict:
    """Per level: whether every drafted stream's greedy text equals the target-only stream with the same prompt (and
    the same repeat)."""
    target = {(s.level, s.run, s.index): s.text for s in streams if s.mode == "target"}
    out = {}
    for s in streams:
        if s.mode == "draft" and (s.level, s.run, s.index) in target:
            out.setdefault(s.level, True)
            out[s.level] &= s.text == target[(s.level, s.run, s.index)]
    return {str(k): v for k, v in sorted(out.items())}


def ratio_text(x: float | None, base: float | None) -> str:
    """x against base as "2.52x", "n/a" when either is missing (a level without a steady window)."""
    return f"{x / base:.2f}x" if x and base else "n/a"


def markdown(result: dict) -> str:
    lines = [f"# ggufbridge bench --concurrency: {result['model']}", "",
             f"runtime: `{result['runtime']['bin']}` commit `{result['runtime']['commit']}`; recipe "
             f"`{result['recipe']}`; {result['slots']} slots x {result['ctx']} tokens; prompts of "
             f"{result['prompt_tokens']} tokens, {result['n_predict']} generated tokens per stream; OpenAI API, "
             f"streamed, measured by the client", "",
             "| mode | streams | per-stream decode tok/s | aggregate decode tok/s | vs one stream | "
             "aggregate while all decode tok/s | vs one stream | TTFT p50 s | TTFT p95 s | output tok/s |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    num = lambda x: f"{x:.1f}" if x else "n/a"  # noqa: E731
    for mode in ("target", "draft"):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        one = rows[0] if rows and rows[0]["streams"] == 1 else {}
        for r in rows:
            per = ", ".join(num(x) for x in r["per_stream_decode_tok_s"])
            steady = r.get("steady_decode_tok_s")  # absent in a concurrency.json written before it existed
            lines.append(f"| {mode} | {r['streams']} | {per} | {r['aggregate_decode_tok_s']:.1f} | "
                         f"{ratio_text(r['aggregate_decode_tok_s'], one.get('aggregate_decode_tok_s'))} | "
                         f"{num(steady)} | {ratio_text(steady, one.get('steady_decode_tok_s'))} | "
                         f"{r['ttft_p50_s']:.3f} | {r['ttft_p95_s']:.3f} | {r['output_tok_s']:.1f} |")
    if result.get("repeats", 1) > 1:
        lines += ["", f"Each level ran {result['repeats']} times; each row is the run with the median aggregate decode "
                  "tok/s (every run's aggregate, steady and TTFT p50: `runs` in concurrency.json)."]
    if result.get("greedy_identical"):
        same = ", ".join(f"{k} streams: {'yes' if v else 'NO'}" for k, v in result["greedy_identical"].items())
        lines += ["", f"Drafted greedy text equals target-only text per stream: {same}."]
    lines += ["", "Commands:", ""] + [f"- {m}: `{c}`" for m, c in result["commands"].items()]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    from ggufbridge.runtime.benchmark import two_panel_plot

    nan = float("nan")
    lines = []
    for mode, style in (("target", "o-"), ("draft", "s--")):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        if rows:
            xs = [r["streams"] for r in rows]
            lines.append((mode, style, xs, [r["aggregate_decode_tok_s"] for r in rows],
                          [r["mean_stream_decode_tok_s"] for r in rows]))
            steady = [r.get("steady_decode_tok_s") or nan for r in rows]
            lines.append((f"{mode}, while all decode", style[0] + ":", xs, steady,
                          [y / x for x, y in zip(xs, steady)]))
    two_panel_plot(result, path, "concurrent streams", ("aggregate decode tok/s", "per-stream decode tok/s (mean)"),
                   lines)


def write_outputs(result: dict, out_dir: Path) -> dict[str, Path]:
    """concurrency.json / .md / .png, each written under a temporary name and renamed into place."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "concurrency.json", "markdown": out_dir / "concurrency.md",
             "plot": out_dir / "concurrency.png"}
    writers = {"json": lambda p: p.write_text(json.dumps(result, indent=2) + "\n"),
               "markdown": lambda p: p.write_text(markdown(result)), "plot": lambda p: plot(result, p)}
    for kind, final in paths.items():
        tmp = final.with_name(f".{final.stem}.part{final.suffix}")
        writers[kind](tmp)
        tmp.replace(final)
    return paths


def stream_dicts(streams: list[Stream]) -> list[dict]:
    return [asdict(s) | {"ttft_s": s.ttft_s, "decode_tok_s": s.decode_tok_s} for s in streams]


def slot_context(prompt_tokens: int, n_predict: int) -> int:
    """Context per slot for one request: the prompt, the chat template's own tokens (a few dozen), the answer."""
    return -(-(prompt_tokens + 64 + n_predict) // 256) * 256


def bench_concurrency(out_dir: str | Path, *, levels: list[int], prompt_tokens: int = 1024, n_predict: int = 128,
                      repeats: int = 1, draft: bool = False, recipe: str = "cpu", threads: int | None = None,
                      log_dir: str | Path | None = None, llama_bin: str | None = None, timeout: float = 900.0,
                      on_command: Callable[[str, str], None] | None = None,
                      on_level: Callable[[str, int], None] | None = None) -> dict:
    """Every level of `levels`, target-only and (with `draft`) drafted, one llama-server per mode planned with
    max(levels) slots of slot_context() tokens, each level `repeats` times (its row: the median run, level_row).
    Returns the result that `write_outputs` writes
    (concurrency.json); server logs go to `log_dir` (default OUT_DIR/bench). `on_command(mode, command)` hears
    each server's command line before it starts, `on_level(mode, level)` each level once measured."""
    from ggufbridge.errors import RuntimeNotFound
    from ggufbridge.runtime.session import prepare

    levels = sorted(set(levels))
    if not levels or levels[0] < 1:
        raise GGUFBridgeError(f"--concurrency: expected levels of at least 1, found {levels}")
    if repeats < 1:
        raise GGUFBridgeError(f"--repeats: expected at least 1, found {repeats}")
    s = prepare(out_dir, recipe, draft=draft, ctx=slot_context(prompt_tokens, n_predict), llama_bin=llama_bin,
                rpc_workers=0, parallel=max(levels))
    from ggufbridge.runtime.benchmark import check_context

    check_context(s, slot_context(prompt_tokens, n_predict), prompt_tokens, n_predict)
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    dest = Path(log_dir) if log_dir else Path(out_dir) / "bench"
    dest.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"
    commands, rows, streams = {}, [], []
    for mode in ["target"] + (["draft"] if draft else []):
        port = sv.free_port(host)
        opts = sv.ServeOptions(host=host, port=port, draft=mode == "draft", threads=threads)
        argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art, opts)
        commands[mode] = sv.printable(argv)
        if on_command is not None:
            on_command(mode, commands[mode])
        got_rows, got = run_mode(mode, argv, host, port, dest / f"llama-server-concurrency-{mode}.log", s.rt.env(),
                                 levels, prompt_tokens, n_predict, timeout, repeats=repeats, on_level=on_level)
        rows += got_rows
        streams += got
    return {
        "model": s.art.target.path.name, "recipe": s.recipe.name, "slots": s.plan.slots, "ctx": s.plan.ctx,
        "prompt_tokens": prompt_tokens, "n_predict": n_predict, "levels": levels, "repeats": repeats,
        "runtime": {"bin": str(s.rt.bin_dir), "commit": s.rt.commit, "version": s.rt.version},
        "commands": commands, "rows": rows, "greedy_identical": compare_modes(streams),
        "streams": stream_dicts(streams),
    }
