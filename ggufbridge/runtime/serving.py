"""`serve`: a converted folder on llama-server with a hardware recipe, in the foreground, until a signal.

What `ggufbridge serve` calls. The command line is built before anything starts (so `dry_run` shows exactly what
would run); `--rpc local` workers start on loopback under the same signal handling as the server, and are stopped
with it. Lines for the user go to `say` (what serve reports) and `warn` (what the user should know); both default
to the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import RuntimeNotFound, ServerError
from ggufbridge.runtime import lifecycle, patches
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import rpc as rpcw
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.artifacts import ModelSpec, home_of
from ggufbridge.runtime.recipes import load_recipe
from ggufbridge.runtime.session import Session, prepare

log = logging.getLogger(__name__)


def _log_info(text: str) -> None:
    log.info("%s", text)


def _log_warning(text: str) -> None:
    log.warning("%s", text)


@dataclass
class ServeSetup:
    """Everything decided before a process starts: the session, the options and the server's command line."""

    session: Session
    opts: sv.ServeOptions
    server_bin: Path
    argv: list[str]
    local_rpc: bool  # --rpc local: workers started here, their ports known only once they run

    @property
    def endpoints(self) -> list[str]:
        return self.opts.rpc


def setup(model: "str | Path | ModelSpec", *, recipe: str = "cpu", draft: bool = False, host: str = "127.0.0.1",
          port: int = 8080, ctx: int | None = None, parallel: int | None = None, api_key: str | None = None,
          rpc: str | None = None,
          threads: int | None = None, llama_bin: str | None = None, media_path: str | Path | None = None,
          think: bool | None = None, reasoning_budget: int | None = None, dry_run: bool = False,
          n_predict: int | None = sv.SERVE_N_PREDICT) -> ServeSetup:
    """Load, plan and build the command. `ctx` is per slot, `parallel` the slots (default the recipe's). `rpc` is
    `HOST:PORT[,...]` or `local`; with `dry_run` and no `rpc`, a recipe's workers are shown as placeholders
    (WORKERi:PORT)."""
    rec = load_recipe(recipe)
    workers = rec.rpc["workers"]
    local = rpc is not None and rpc.strip().lower() == "local"
    if local and not workers:
        raise ServerError(f"--rpc local: recipe {rec.name} has no RPC workers ([rpc] workers = 0)")
    if local:  # the real ports are picked when the workers start
        endpoints = [f"{rpcw.LOOPBACK}:PORT{i}" for i in range(workers)]
    elif dry_run and workers and not rpc:
        endpoints = [f"WORKER{i}:{rec.rpc['default_port']}" for i in range(workers)]
    else:
        endpoints = sv.parse_rpc(rpc, workers)
    # without the rollback patch, drafting on several slots can change a stream's greedy output (docs/benchmarks.md,
    # "Drafting with several streams"): on such a runtime --draft serves one slot unless more are asked for
    inexact = draft and _lacks_rollback_fix(llama_bin)
    fault = inexact and parallel is None and rec.server["parallel"] > 1
    s = prepare(model, recipe, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=workers,
                parallel=1 if fault else parallel)
    why = (f"this runtime lacks the patch that keeps drafting streams apart (its libllama has no "
           f"{patches.ROLLBACK_KEY}): a stream's greedy output can change when several slots draft "
           f"(docs/benchmarks.md)")
    if fault:
        s.plan.notes.append(f"--draft serves one slot (the recipe has {rec.server['parallel']}): {why}; --parallel N "
                            f"serves more")
    elif inexact and s.plan.slots > 1:
        s.plan.notes.append(f"--draft on {s.plan.slots} slots: {why}")
    extra = ["--media-path", str(Path(media_path).resolve())] if media_path else []
    if s.art.mmproj is not None:  # video_url parts: frames sampled as MiniCPM-V's video processor does
        from ggufbridge.vision import ffshim
        from ggufbridge.vision.video import VideoSettings

        extra += ffshim.server_args(VideoSettings.of_mmproj(s.art.mmproj.path))
    opts = sv.ServeOptions(host=host, port=port, api_key=api_key, draft=draft, rpc=endpoints, threads=threads,
                           extra=extra, think=think, reasoning_budget=reasoning_budget, n_predict=n_predict)
    server_bin = s.rt.bin_dir / "llama-server" if s.rt else Path("llama-server")
    return ServeSetup(s, opts, server_bin, sv.server_argv(server_bin, s.recipe, s.plan, s.art, opts), local)


def _lacks_rollback_fix(llama_bin: str | None) -> bool:
    """Whether the runtime `serve` will use is known to lack the multi-slot rollback fix (one that is not found is
    not known: `prepare` reports it)."""
    try:
        return not loc.locate(llama_bin).exact_multislot_drafting
    except RuntimeNotFound:
        return False


def wildcard_warning(host: str, api_key: str | None) -> str | None:
    if lifecycle.wildcard(host) and not api_key:
        return f"warning: listening on {host} without --api-key: anyone on the network can use it"
    return None


def dry_run_lines(st: ServeSetup) -> list[str]:
    """What `serve --dry-run` prints: the recipe, the worker commands, the server command, the plan, and why this
    runtime would refuse."""
    s = st.session
    lines = [f"recipe: {s.recipe.name} - {s.recipe.description}"]
    for i, ep in enumerate([] if st.local_rpc else st.endpoints):
        lines.append(f"on RPC worker {i} (never bind 0.0.0.0): ggml-rpc-server --host {ep.rsplit(':', 1)[0]} "
                     f"--port {ep.rsplit(':', 1)[1]}")
    lines.append(f"command: {sv.printable(st.argv)}")
    lines.append(s.plan.format())
    if s.image_loss:
        lines.append(f"note: images: {s.image_loss}")
    lines += [f"note: this runtime would refuse to serve: {p}" for p in s.problems]
    return lines


def serve(model: "str | Path | ModelSpec", *, log_path: str | Path | None = None, timeout: float = 900.0,
          dry_run: bool = False, say: Callable[[str], None] = _log_info,
          warn: Callable[[str], None] = _log_warning, **options) -> lifecycle.Outcome | None:
    """Serve `model` (runtime.artifacts: a folder, GGUF files or a hub spec) until SIGINT/SIGTERM (`options`:
    those of `setup`). With `dry_run`, say what would run and return None; else the Outcome (which signal stopped
    it, whether it was ready). Raises ServerError when the server fails to start or exits on its own; no process
    outlives the call."""
    st = setup(model, dry_run=dry_run, **options)
    s, opts = st.session, st.opts
    wild = wildcard_warning(opts.host, opts.api_key)
    if dry_run:
        if wild:
            warn(wild)
        for line in dry_run_lines(st):
            say(line)
        return None
    if s.problems:
        raise RuntimeNotFound(s.problems[0] if len(s.problems) == 1 else " | ".join(s.problems))
    if s.image_loss:
        warn(f"warning: images: {s.image_loss}")
    if wild:
        warn(wild)
    if not st.local_rpc:
        lifecycle.check_workers(st.endpoints)
    log_file = Path(log_path) if log_path else lifecycle.default_log(home_of(model))
    srv = sv.Server(st.argv, opts.host, opts.port, log_file, env=s.rt.env())
    pool: list[rpcw.Worker] = []

    def start_workers():
        """--rpc local: the workers on loopback, then the server command that names their real ports."""
        if st.local_rpc:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            pool.extend(rpcw.start_local(s, log_file.parent, threads=opts.threads))
            opts.rpc = [w.endpoint for w in pool]
            for i, w in enumerate(pool):
                say(f"RPC worker {i}: {w.endpoint} (log {w.log})")
            srv.argv = sv.server_argv(st.server_bin, s.recipe, s.plan, s.art, opts)
        say(f"command: {sv.printable(srv.argv)}")
        say(s.plan.format())

    def ready():
        # the page (llama-server's own web UI, embedded by scripts/build_runtime.sh) first: `ready:` stays the last
        # line, the one scripts reading our output wait for
        if s.rt.has_page:
            say(f"chat page: {srv.url}/" + ("  (it asks for the --api-key)" if opts.api_key else ""))
        else:
            say(f"no chat page in this llama-server (API only): {loc.PAGE_HINT}")
        say(f"ready: {srv.url}/v1  (model {sv.model_alias(s.art)}; health {srv.url}/health; log {log_file})")

    try:
        return lifecycle.run_foreground(srv, timeout, ready, before_start=start_workers)
    finally:
        rpcw.stop_workers(pool)
