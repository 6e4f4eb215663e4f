"""The llama.cpp command lines (llama-server, llama-cli) from a recipe, a memory plan and a converted folder.

Pure: nothing here starts a process or opens a socket, so every flag is tested without a runtime.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import ServerError
from ggufbridge.runtime.artifacts import Artifacts, without_split_suffix
from ggufbridge.runtime.memory import MemoryPlan, Pool
from ggufbridge.runtime.recipes import Recipe

# What `serve` answers at most when a request sets no length (the chat page sets none): without it llama-server
# generates until the context is full (its -n default is -1). `serve -n` overrides it, -1 restores unlimited.
SERVE_N_PREDICT = 4096

_HOSTPORT = re.compile(r"^(?:\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    draft: bool = False
    rpc: list[str] = field(default_factory=list)
    threads: int | None = None
    metrics: bool = True
    extra: list[str] = field(default_factory=list)
    think: bool | None = None  # None: the recipe's server.think
    reasoning_budget: int | None = None  # None: the recipe's server.reasoning_budget (-1 = unlimited)
    n_predict: int | None = None  # -n: the answer length of a request that sets none (None: llama.cpp's, unlimited)


def parse_rpc(value: str | None, workers: int) -> list[str]:
    """`HOST:PORT[,HOST:PORT...]`, exactly `workers` of them (the recipe's [rpc] workers)."""
    items = [v.strip() for v in value.split(",") if v.strip()] if value else []
    for v in items:
        m = _HOSTPORT.match(v)
        if not m or not 0 < int(m.group(1)) < 65536:
            raise ServerError(f"--rpc: expected HOST:PORT, found {v!r}")
        if v.startswith("0.0.0.0:"):
            raise ServerError(f"--rpc: {v} is not an address to connect to; give the worker's own address")
    if len(items) != workers:
        raise ServerError(f"--rpc: the recipe needs {workers} worker endpoint(s) (HOST:PORT), found {len(items)}"
                          + ("; start `ggml-rpc-server --host ADDR --port 50052` on the second host and pass "
                             "--rpc ADDR:50052" if workers and not items else ""))
    return items


def model_alias(art: Artifacts) -> str:
    """The served model's name: the target file's, without `.gguf` (and a split model's -00001-of-0000N)."""
    return without_split_suffix(art.target.path.name).removesuffix(".gguf")


def _common_args(recipe: Recipe, plan: MemoryPlan, art: Artifacts, opts: ServeOptions) -> list[str]:
    srv, drf = recipe.server, recipe.draft
    a = ["-m", str(art.target.path), "-b", str(plan.figures["server_batch"]), "-ub", str(srv["ubatch"]),
         "-fa", srv["flash_attn"], "-ctk", srv["cache_type_k"], "-ctv", srv["cache_type_v"],
         "-ngl", str(plan.n_gpu_layers), "--fit", "off"]  # --fit off: run exactly the planned settings
    if plan.n_cpu_moe:
        a += ["--n-cpu-moe", str(plan.n_cpu_moe)]
    if plan.tensor_split:
        a += ["--tensor-split", ",".join(f"{x:g}" for x in plan.tensor_split)]
    if opts.rpc:
        a += ["--rpc", ",".join(opts.rpc)] + device_args(recipe, plan, mmproj=art.mmproj is not None,
                                                         draft=opts.draft)
    if srv["backend_sampling"]:
        a.append("--backend-sampling")
    threads = opts.threads or srv["threads"]
    if threads:
        a += ["-t", str(threads)]
    if art.mmproj is not None:
        a += ["--mmproj", str(art.mmproj.path)]
        if not srv["mmproj_offload"]:
            a.append("--no-mmproj-offload")
    a += reasoning_args(recipe, opts)
    if opts.draft:
        if art.draft is None:
            raise ServerError(f"--draft: {art.missing('draft')}; convert the DSpark draft into this folder, or "
                              f"name one with --model-draft FILE")
        ngld = drf["n_gpu_layers"]
        a += ["-md", str(art.draft.path), "--spec-type", "draft-dspark",
              "--spec-draft-n-max", str(drf["n_max"]), "--spec-draft-n-min", str(drf["n_min"]),
              "-ngld", str(ngld), "-ctkd", drf["cache_type_k"], "-ctvd", drf["cache_type_v"]]
        if drf["p_min"] > 0:
            a += ["--spec-draft-p-min", f"{drf['p_min']:g}"]
    return a + list(srv["extra_args"]) + list(opts.extra)


def plan_devices(plan: MemoryPlan) -> list[Pool]:
    """The planned pools that are llama.cpp devices (they have its device name), in the runtime's order (RPC
    first)."""
    return [p for p in plan.pools if p.device]


def device_args(recipe: Recipe, plan: MemoryPlan, *, mmproj: bool, draft: bool) -> list[str]:
    """With RPC workers, exactly the planned devices. Left to itself the runtime also takes every local GPU the
    plan did not count (on a box of several GPUs, the ones `--rpc local` gave the workers), and the projector and
    the draft follow the first device, which is a worker: over the network, against the plan."""
    devs = plan_devices(plan)
    if not devs:
        return []
    a = ["--device", ",".join(p.device for p in devs)]
    local = [p.device for p in devs if p.kind != "rpc"]
    if mmproj:
        a += ["--mmproj-device", local[0] if local and recipe.server["mmproj_offload"] else "none"]
    if draft and recipe.draft["n_gpu_layers"] != 0:
        a += ["--device-draft", devs[-1].device]  # the plan puts the draft on the last device
    return a


def reasoning_args(recipe: Recipe, opts: ServeOptions) -> list[str]:
    """Thinking through the runtime's own switch, always explicit: its default `auto` follows the template, and
    turns thinking on for Qwen3.5's (which thinks unless `enable_thinking` is false). `--reasoning` sets the
    template's `enable_thinking` default; a request's `chat_template_kwargs` still overrides it."""
    think = recipe.server["think"] if opts.think is None else opts.think
    budget = recipe.server["reasoning_budget"] if opts.reasoning_budget is None else opts.reasoning_budget
    a = ["--reasoning", "on" if think else "off"]
    if budget >= 0:
        a += ["--reasoning-budget", str(budget)]
    return a


def server_argv(server_bin: str | Path, recipe: Recipe, plan: MemoryPlan, art: Artifacts,
                opts: ServeOptions) -> list[str]:
    a = [str(server_bin), *plan.context_args(), *_common_args(recipe, plan, art, opts), "--host", opts.host,
         "--port", str(opts.port), "-a", model_alias(art), "--jinja",
         # thoughts in message.reasoning_content (OpenAI clients' field), not inline <think> text in content
         "--reasoning-format", "deepseek"]
    if opts.n_predict is not None:
        # the default of requests without max_tokens / n_predict, as the chat page sends them
        # (tools/server/server-context.cpp:1799); a request's own value still wins
        a += ["-n", str(opts.n_predict)]
    if opts.metrics:
        a.append("--metrics")
    if opts.api_key:
        a += ["--api-key", opts.api_key]
    return a


def cli_argv(cli_bin: str | Path, recipe: Recipe, plan: MemoryPlan, art: Artifacts, opts: ServeOptions, *, prompt: str,
             n_predict: int, temp: float, seed: int, out_file: str | Path) -> list[str]:
    """llama-cli in this tree is a chat client; -st answers one turn and exits, -o writes the transcript."""
    if plan.slots != 1:
        raise ValueError(f"llama-cli runs one sequence; plan it with one slot, not {plan.slots}")
    return [str(cli_bin), "-c", str(plan.ctx), *_common_args(recipe, plan, art, opts), "-p", prompt, "-st",
            "-n", str(n_predict), "--temp", f"{temp:g}", "--seed", str(seed), "-o", str(out_file), "--jinja"]


def printable(argv: list[str]) -> str:
    """The command as a shell line, with an API key masked."""
    shown = list(argv)
    for i, a in enumerate(shown[:-1]):
        if a == "--api-key":
            shown[i + 1] = "***"
    return shlex.join(shown)
