"""Options that several commands take, each defined once so that spelling, type, range and help cannot drift.

Every entry is a factory returning a click decorator; a command lists the ones it takes, one line each:

    @click.command()
    @click.argument("out_dir", type=click.Path(file_okay=False))
    @opt.recipe()
    @opt.draft("Include the DSpark draft (weights, KV, recurrent snapshots).")
    @opt.ctx(default=None, help="Fixed context size instead of searching.")
    @opt.llama_bin()

A factory takes `help=` (and `default=` where commands differ on purpose) when one meaning needs other words;
everything else (names, types, ranges, metavars, env vars) is fixed here. Adding an option to a command is one
line; an option that a second command needs moves here.

Two kinds of recipe, two names: `--recipe` is a hardware recipe (serve, run, plan, bench: what to offload, KV
types, draft settings); `--mix` is a quantisation mix (convert, quantize: a type per tensor class). `--recipe`
is still accepted for a mix in convert and quantize, with a one-line deprecation warning.
"""

from __future__ import annotations

import functools
import math
import re
from importlib import resources

import click

from ggufbridge.runtime.recipes import MAX_THREADS
from ggufbridge.units import INT32_MAX  # every integer option's upper bound

MAX_BYTES = 2**60  # a byte-size option beyond an exbibyte is a typo


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, which lets `nan` through (every comparison with NaN is false) and `inf` past an open
    upper end: every float option is this one."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"expected a finite number, found {value!r}", param, ctx)
        return v


def _names(*parts: str) -> str:
    folder = resources.files("ggufbridge").joinpath(*parts)
    return ", ".join(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml")))


def _option(*decls, **attrs):
    """A factory for one option: `help` (and `default`) may be overridden per command, nothing else."""

    def factory(help: str | None = None, **override):
        unknown = set(override) - {"default"}
        if unknown:
            raise TypeError(f"only help= and default= may differ per command, found {sorted(unknown)}")
        kw = {**attrs, **override}
        if help is not None:
            kw["help"] = help
        return click.option(*decls, **kw)

    return factory


# --- running a converted folder (serve, run, plan, bench) -----------------------------------------------------------

recipe = _option("--recipe", "recipe_name", default="cpu", show_default=True, metavar="NAME|FILE.toml",
                 help=f"Hardware recipe: a packaged one ({_names('recipes')}) or a path to a recipe .toml "
                      "(decides -ngl, KV types, draft settings).")
draft = _option("--draft", is_flag=True, help="Speculative decoding with the folder's DSpark draft.")
DRAFT_IS_A_FLAG = ("--draft is a flag now and the draft file its own option: --model-draft FILE (or -md FILE, as "
                   "llama.cpp spells it), e.g. `ggufbridge serve MODEL.gguf --model-draft dspark.gguf`")


class ModelCommand(click.Command):
    """The command of serve, run, plan and bench: the old spelling `--draft FILE` (a file after the flag) is
    refused with a line that names the new one, instead of click's bare "unexpected extra argument"."""

    def parse_args(self, ctx, args):
        given = list(args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            if "--draft" in given and "unexpected extra argument" in str(e.message):
                raise click.UsageError(DRAFT_IS_A_FLAG, ctx) from None
            raise


def model(draft_help: str = "Speculative decoding with the DSpark draft: MODEL's, or the --model-draft FILE."):
    """MODEL, `--mmproj FILE`, `--draft` and `-md/--model-draft FILE` (serve, run, plan, bench; the command is a
    ModelCommand): the command gets `model` as a runtime.artifacts.ModelSpec and `draft` as a bool (drafting on).
    MODEL is an OUT_DIR of `convert`, a folder of GGUF files, a .gguf file or `hf://ORG/REPO[@REV][:QUANT]`
    (docs/gguf-files.md). `--draft` is a flag, so it never takes MODEL for a draft file; naming a draft file with
    --model-draft turns drafting on, as llama.cpp's -md does."""

    def decorator(f):
        @functools.wraps(f)
        def wrapper(*args, model, mmproj=None, draft=False, model_draft=None, **kwargs):
            from ggufbridge.runtime.artifacts import ModelSpec

            spec = ModelSpec(model, mmproj, model_draft)
            return f(*args, model=spec, draft=bool(draft or model_draft), **kwargs)

        wrapper = click.option("-md", "--model-draft", "model_draft", default=None, metavar="FILE",
                               help="The DSpark draft GGUF (a dflash file, ours or upstream llama.cpp's, checked "
                                    "against the model) instead of MODEL's own; turns --draft on.")(wrapper)
        wrapper = click.option("--draft", "draft", is_flag=True, default=False, help=draft_help)(wrapper)
        wrapper = click.option("--mmproj", "mmproj", default=None, metavar="FILE",
                               help="The projector GGUF for images and video (instead of MODEL's own or the one "
                                    "beside MODEL.gguf).")(wrapper)
        return click.argument("model", metavar="MODEL")(wrapper)

    return decorator


ctx = _option("--ctx", type=click.IntRange(256, INT32_MAX), default=None, show_default=True,
              help="Context size [default: the plan's].")
parallel = _option("--parallel", type=click.IntRange(1, 256), default=None,
                   help="Slots: requests served at once, each with the plan's context and its own recurrent state "
                        "[default: the recipe's server.parallel]. Refused, naming what fits, when memory does not "
                        "allow it.")
threads = _option("--threads", type=click.IntRange(1, MAX_THREADS), default=None, help="CPU threads for llama-server.")
llama_bin = _option("--llama-bin", type=click.Path(file_okay=False), envvar="LLAMA_CPP_BIN",
                    help="A llama.cpp build/bin directory to use instead of the cached build (env LLAMA_CPP_BIN).")
timeout = _option("--timeout", type=FiniteFloatRange(1), default=900.0, show_default=True,
                  help="Seconds to wait for llama-server's /health.")
n_predict = _option("-n", "--n-predict", type=click.IntRange(1, INT32_MAX), default=256, show_default=True,
                    help="Tokens to generate.")


def think(f):
    """--think/--no-think and --reasoning-budget (serve, run); both default to the recipe's [server] think /
    reasoning_budget."""
    f = click.option("--reasoning-budget", type=click.IntRange(-1, INT32_MAX), default=None,
                     help="Most tokens to think before the end of thinking is forced (-1: no limit) [default: the "
                          "recipe's server.reasoning_budget].")(f)
    f = click.option("--think/--no-think", default=None,
                     help="Let the model think first (thoughts come back in message.reasoning_content); a "
                          "request's chat_template_kwargs {\"enable_thinking\": ...} still decides. [default: the "
                          "recipe's server.think, off in the packaged recipes, as upstream's recommended serving]")(f)
    return f


# --- output -----------------------------------------------------------------------------------------------------------

as_json = _option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


# --- quantisation (convert, quantize) ---------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


class ByteSize(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES:
            return value
        m = _SIZE.match(str(value))
        if not m:
            self.fail(f"expected a byte count such as 20000000000, 20GB or 18.5GiB, found {value!r}", param, ctx)
        n = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if not n <= MAX_BYTES:  # also inf, from a number of hundreds of digits
            self.fail(f"expected at most {MAX_BYTES} bytes, found {value!r}", param, ctx)
        return int(n)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(|s|m|min|h)\s*$", re.I)
_SECONDS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600}
MAX_SECONDS = 366 * 24 * 3600  # a duration beyond a year is a typo


class Duration(click.ParamType):
    """Seconds, or a number with s, m/min or h: 300, 5m, 2.5h."""

    name = "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_SECONDS:
            return float(value)
        m = _DURATION.match(str(value))
        v = float(m.group(1)) * _SECONDS[m.group(2).lower()] if m else None
        if v is None or not 0 < v <= MAX_SECONDS:
            self.fail(f"expected a positive duration such as 300, 5m or 2.5h (at most a year), found {value!r}",
                      param, ctx)
        return v


fit_bytes = _option("--fit-bytes", type=ByteSize(), default=None,
                    help="Pick the best type/mix whose weights + KV cache for --ctx + state fit this many bytes.")

quant_type = _option("--quant", default=None, metavar="TYPE",
                     help="A llama-quantize type (Q8_0, Q6_K, Q5_K_M, Q4_K_M, IQ4_XS, Q3_K_M, ...): llama.cpp's "
                          "own mix.")
imatrix = _option("--imatrix", type=click.Path(dir_okay=False), default=None,
                  help="Importance matrix from `ggufbridge imatrix` (needed by IQ1/IQ2/IQ3_XXS types).")
quant_threads = _option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
                        help="CPU threads [default: up to 8].")

MIX_DEPRECATED = ("warning: --recipe for a quantisation mix is deprecated, use --mix (--recipe names a hardware "
                  "recipe in serve, run, plan and bench)")


def mix(help: str | None = None):
    """`--mix NAME|FILE.toml` (passed to the command as `mix`), and the old spelling `--recipe`, hidden: it still
    works and prints MIX_DEPRECATED on stderr."""

    def decorator(f):
        @functools.wraps(f)
        def wrapper(*args, mix=None, deprecated_recipe=None, **kwargs):
            if deprecated_recipe is not None:
                click.echo(MIX_DEPRECATED, err=True)
                if mix is not None and mix != deprecated_recipe:
                    raise click.UsageError(f"--mix {mix} and --recipe {deprecated_recipe} disagree: give --mix only")
                mix = deprecated_recipe
            return f(*args, mix=mix, **kwargs)

        wrapper = click.option("--recipe", "deprecated_recipe", default=None, hidden=True,
                               metavar="NAME|FILE.toml", help="Deprecated spelling of --mix.")(wrapper)
        return click.option("--mix", "mix", default=None, metavar="NAME|FILE.toml",
                            help=help or f"A quantisation mix, a type per tensor class: a packaged one "
                                         f"({_names('recipes', 'quant')}) or a TOML file (see docs/quant.md).")(wrapper)

    return decorator
