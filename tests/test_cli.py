"""The CLI's own contract: shared options that cannot drift, one name per kind of recipe (with the old spelling
deprecated), -v/-vv, and which failures are the user's (one line, exit 2) and which are bugs (traceback, exit 1)."""

from __future__ import annotations

import errno
import logging
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from ggufbridge.cli import COMMANDS, cli, main
from ggufbridge.cli._options import MIX_DEPRECATED
from ggufbridge.errors import GGUFFileError

RUNTIME_COMMANDS = ("serve", "run", "plan", "bench")


def _params(name: str) -> dict:
    cmd = cli.get_command(None, name)
    return {p.name: p for p in cmd.params}


def _spec(p) -> tuple:
    """What must not differ between two commands' copies of one option (help and default may)."""
    return (p.name, tuple(p.opts), tuple(p.secondary_opts), repr(p.type), p.envvar, p.metavar, p.is_flag, p.hidden)


SHARED = {  # option -> the commands that take it from ggufbridge.cli._options
    "--recipe": RUNTIME_COMMANDS,
    "--draft": RUNTIME_COMMANDS,  # convert's --draft is the draft checkpoint to convert, another option
    "--ctx": ("serve", "run", "plan"),
    "--threads": ("serve", "bench", "quantize", "imatrix"),
    "--llama-bin": ("serve", "run", "bench", "doctor"),
    "--timeout": ("serve", "bench"),
    "--n-predict": ("run", "bench"),
    "--json": ("plan", "inspect", "verify", "quantize"),
    "--quant": ("convert", "quantize"),
    "--mix": ("convert", "quantize"),
    "--imatrix": ("convert", "quantize"),
    "--think": ("serve", "run"),
    "--reasoning-budget": ("serve", "run"),
}


def _by_spelling(name: str, spelling: str):
    (p,) = [p for p in _params(name).values() if spelling in p.opts]
    return p


@pytest.mark.parametrize("spelling", sorted(SHARED))
def test_an_option_is_spelled_and_typed_the_same_in_every_command(spelling):
    specs = {name: _spec(_by_spelling(name, spelling)) for name in SHARED[spelling]}
    assert len(set(specs.values())) == 1, specs


def test_the_runtime_commands_take_the_hardware_recipe():
    for name in RUNTIME_COMMANDS:
        p = _params(name)["recipe_name"]
        assert p.opts == ["--recipe"] and p.default == "cpu", name
        assert "rtx4090" in p.help and "Hardware recipe" in p.help, name


@pytest.mark.parametrize("command", ["convert", "quantize"])
def test_mix_is_the_quant_recipe_and_recipe_its_hidden_old_spelling(command):
    params = _params(command)
    assert params["mix"].opts == ["--mix"] and not params["mix"].hidden
    assert params["deprecated_recipe"].opts == ["--recipe"] and params["deprecated_recipe"].hidden
    out = CliRunner().invoke(cli, [command, "--help"]).output
    assert "--mix NAME|FILE.toml" in out and "--recipe" not in out


@pytest.mark.parametrize("spelling, warned", [("--mix", False), ("--recipe", True)])
def test_quantize_mix_spellings_reach_the_library_alike(spelling, warned, tmp_path):
    """An unknown mix is refused by the library with the same line under either spelling; only --recipe warns."""
    import numpy as np
    from gguf import GGUFWriter

    src = tmp_path / "in.gguf"  # a valid unquantised GGUF: the mix is what is refused
    w = GGUFWriter(str(src), "qwen35moe")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res = CliRunner().invoke(cli, ["quantize", str(src), "-o", str(tmp_path / "o.gguf"), spelling, "nope"])
    assert res.exit_code == 2, res.output
    assert "unknown quantisation recipe 'nope'" in res.stderr
    assert (MIX_DEPRECATED in res.stderr) is warned
    assert MIX_DEPRECATED not in res.stdout


@pytest.mark.parametrize("spelling, warned", [("--mix", False), ("--recipe", True)])
def test_convert_mix_spellings(spelling, warned, tmp_path):
    res = CliRunner().invoke(cli, ["convert", str(tmp_path / "nope"), "-o", str(tmp_path / "out"), spelling, "hq4"])
    assert res.exit_code == 2 and "no such model folder" in res.stderr, res.output
    assert (MIX_DEPRECATED in res.stderr) is warned


def test_mix_and_recipe_together_must_agree(tmp_path):
    res = CliRunner().invoke(cli, ["quantize", str(tmp_path / "in.gguf"), "-o", str(tmp_path / "o.gguf"),
                                   "--mix", "hq4", "--recipe", "hq3"])
    assert res.exit_code == 2 and "disagree" in res.output


# --- -v / -vv ------------------------------------------------------------------------------------------------------

EMIT = """
import logging, sys
from ggufbridge.cli import configure_logging
configure_logging(int(sys.argv[1]))
ours, lib = logging.getLogger("ggufbridge.convert"), logging.getLogger("urllib3")
ours.debug("ours-debug"); ours.info("ours-info"); ours.warning("ours-warning")
lib.debug("lib-debug"); lib.info("lib-info"); lib.warning("lib-warning")
"""


@pytest.mark.parametrize("verbose, shown", [
    (0, {"ours-info", "ours-warning", "lib-warning"}),
    (1, {"ours-debug", "ours-info", "ours-warning", "lib-warning"}),
    (2, {"ours-debug", "ours-info", "ours-warning", "lib-debug", "lib-info", "lib-warning"}),
    (5, {"ours-debug", "ours-info", "ours-warning", "lib-debug", "lib-info", "lib-warning"}),
])
def test_verbosity_levels(verbose, shown):
    """Without -v ggufbridge's INFO lines (what it decided for the user) and every warning; -v adds ggufbridge's
    debug lines; -vv the libraries' debug and info too. All on stderr, nothing on stdout."""
    p = subprocess.run([sys.executable, "-c", EMIT, str(verbose)], capture_output=True, text=True, check=True)
    assert p.stdout == ""
    assert set(p.stderr.split()) == shown


BAR = """
import logging, sys, time
from tqdm import tqdm
from ggufbridge import cli
if sys.argv[1] == "plain":  # the handler before: a plain stream handler
    cli.BarAwareHandler = logging.StreamHandler
cli.configure_logging(0)
log = logging.getLogger("ggufbridge.quant.sensitivity")
for i in tqdm(range(3), desc="sensitivity", mininterval=0):
    log.info("unit-%d-measured", i)
"""


@pytest.mark.parametrize("handler", ["ours", "plain"])
def test_a_line_logged_under_a_progress_bar_gets_a_line_of_its_own(handler):
    """`--fit-bytes` logs each unit's KL while its progress bar runs: with a plain stream handler the line was glued
    to the bar's end ("... 1.08s/unit]sensitivity ssm_out@0: KL ..."), now it is written above the bar."""
    p = subprocess.run([sys.executable, "-c", BAR, handler], capture_output=True, text=True, check=True)
    glued = any(f"]unit-{i}-measured" in p.stderr or f"|unit-{i}-measured" in p.stderr for i in range(3))
    own_line = all(f"unit-{i}-measured\n" in p.stderr for i in range(3)) and not glued
    assert own_line == (handler == "ours"), repr(p.stderr)


@pytest.fixture
def restore_log_levels():
    loggers = [logging.getLogger(), logging.getLogger("ggufbridge")]
    levels = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)


@pytest.mark.parametrize("flags, ours, others", [([], logging.INFO, logging.WARNING),
                                                  (["-v"], logging.DEBUG, logging.WARNING),
                                                  (["-vv"], logging.DEBUG, logging.DEBUG),
                                                  (["--verbose", "--verbose"], logging.DEBUG, logging.DEBUG)])
def test_the_group_applies_the_verbosity(flags, ours, others, tmp_path, restore_log_levels):
    CliRunner().invoke(cli, [*flags, "inspect", str(tmp_path / "none.gguf")])
    assert logging.getLogger("ggufbridge").level == ours
    assert logging.getLogger().level == others


# --- user errors vs bugs -------------------------------------------------------------------------------------------

def _inspect_raising(monkeypatch, exc):
    import ggufbridge.inspect

    def boom(path):
        raise exc

    monkeypatch.setattr(ggufbridge.inspect, "inspect_gguf", boom)
    return CliRunner().invoke(cli, ["inspect", "x.gguf"])


@pytest.mark.parametrize("exc, line", [
    (GGUFFileError("x.gguf: not a GGUF file"), "Error: x.gguf: not a GGUF file"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "x.gguf"),
     "Error: No such file or directory: x.gguf"),
    (OSError(errno.ENOSPC, "No space left on device"), "Error: [Errno 28] No space left on device"),
])
def test_errors_the_user_can_act_on_are_one_line_and_exit_2(monkeypatch, exc, line):
    res = _inspect_raising(monkeypatch, exc)
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [line]


@pytest.mark.parametrize("exc", [ValueError("boom"), KeyError("k"), OSError(errno.EINVAL, "Invalid argument"),
                                 AttributeError("no attribute")])
def test_a_bug_is_not_dressed_as_a_user_error(monkeypatch, exc):
    """Under CliRunner the exception itself comes back (exit 1), not an `Error:` line with exit 2."""
    res = _inspect_raising(monkeypatch, exc)
    assert res.exit_code == 1
    assert res.exception is exc
    assert "Error:" not in res.output


def test_main_shows_a_bug_with_its_traceback_and_exit_1(monkeypatch, capsys):
    import ggufbridge.inspect

    def boom(path):
        raise ValueError("boom")

    monkeypatch.setattr(ggufbridge.inspect, "inspect_gguf", boom)
    monkeypatch.setattr(sys, "argv", ["ggufbridge", "inspect", "x.gguf"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: boom" in err
    assert err.rstrip().splitlines()[-2].startswith("ggufbridge: internal error (a bug in ggufbridge")


def test_main_keeps_user_errors_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["ggufbridge", "inspect", str(tmp_path / "missing.gguf")])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("Error: ") and "Traceback" not in err


def test_usage_errors_exit_2():
    res = CliRunner().invoke(cli, ["plan"])
    assert res.exit_code == 2 and "Missing argument" in res.output
    res = CliRunner().invoke(cli, ["serve", "x", "--threads", "0"])
    assert res.exit_code == 2 and "--threads" in res.output


def _int_options():
    for name in sorted(COMMANDS):
        for p in cli.get_command(None, name).params:
            if isinstance(p.type, click.IntRange) or p.type is click.INT:
                yield name, p


@pytest.mark.parametrize("name, param", list(_int_options()), ids=lambda x: getattr(x, "name", x))
def test_every_integer_option_is_bounded_by_int32(name, param):
    """Integers reach llama.cpp as C ints (std::stoi) or GGUF/ctypes int32: 1e11 for -n, --threads, --ctx or
    --reasoning-budget passed click and died in llama-server's start-up with its usage text."""
    assert isinstance(param.type, click.IntRange) and param.type.max is not None \
        and param.type.max <= 2**31 - 1, (name, param.opts, param.type)


def test_an_integer_too_large_for_the_runtime_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(cli, ["run", str(tmp_path), "-p", "hi", "-n", "100000000000"])
    assert res.exit_code == 2 and "100000000000 is not in the range 1<=x<=2147483647" in res.output, res.output


@pytest.mark.parametrize("target, args", [
    ("ggufbridge.compare.run.compare", ["compare", "a.gguf", "-r", "gguf:b.gguf", "--eval", "{ev}"]),
    ("ggufbridge.compare.run.dump_logits", ["dump-logits", "-m", "gguf:a.gguf", "--eval", "{ev}", "-o", "{tmp}/d.st"]),
    ("ggufbridge.runtime.benchmark.prepare", ["bench", "{tmp}"]),
    ("ggufbridge.runtime.oneshot.prepare", ["run", "{tmp}", "-p", "hi"]),
    ("ggufbridge.cli.plan.prepare", ["plan", "{tmp}"]),
    ("ggufbridge.demo.run_demo", ["demo"]),
    ("ggufbridge.verify.verify", ["verify", "{tmp}"]),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_ctrl_c_is_exit_130_and_one_line_in_every_command(monkeypatch, tmp_path, target, args):
    """Ctrl-C in compare, bench, run... was click's "Aborted!" and exit 1, the code the README keeps for bugs."""
    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, interrupted)
    ev = tmp_path / "eval.jsonl"
    ev.write_text('{"text": "hi"}\n')
    res = CliRunner().invoke(cli, [a.format(ev=ev, tmp=tmp_path) for a in args])
    assert res.exit_code == 130, (res.exit_code, res.output)
    assert res.output.strip().splitlines() == [res.output.strip()] and "interrupted by SIGINT" in res.output


def test_a_negative_fit_context_is_named_by_the_option_given(tmp_path):
    """convert --fit-ctx -5 said "--ctx must be at least 0" (quantize's spelling of the option)."""
    res = CliRunner().invoke(cli, ["convert", str(tmp_path), "-o", str(tmp_path / "o"), "--fit-bytes", "1GB",
                                   "--fit-ctx", "-5"])
    assert res.exit_code == 2 and "'--fit-ctx': -5 is not in the range" in res.output, res.output
