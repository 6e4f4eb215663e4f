"""exllamav3 support for MiniCPM-V 4.7: a runtime architecture shim and a text-only view of a checkpoint.

Stock exllamav3 (1.6.5) does not register `MiniCPMV4_7ForConditionalGeneration`. Its text tower is Qwen3.5-MoE
with the same tensor names (`model.language_model.*`, `lm_head`) as exllamav3's Qwen3.5-MoE model, whose config
class reads the text hyper-parameters at the top level of config.json (architecture `Qwen3_5MoeForCausalLM`,
exllamav3/architecture/qwen3_5.py: `Qwen3_5MoeConfig` passes no text_config prefix; `Config.__init__` in
exllamav3/model/config.py assigns the parsed json to `self.config_dict` and checks architectures[0]).
Measured on an H200: exllamav3 1.6.5 quantises and runs the 4.7 text tower when only config.json changes that way.

Two ways to get there, both without touching the installed package's files:

* `install_shim()` registers the 4.7 architecture string at runtime: a subclass of exllamav3's Qwen3.5-MoE config
  whose `config_dict` is the 4.7 config with `text_config` lifted to the top level. `exl3:DIR` uses it, so a pack
  whose config.json still names the 4.7 architecture loads.
* `text_only_view(src, dst)` writes a folder of symlinks to `src` with a rewritten config.json (the measured
  recipe); exllamav3's own quantiser (`python -m exllamav3.conversion.convert_model` or its `convert.py`) runs on
  it unchanged. `python -m ggufbridge.compare.exl3 text-only SRC DST` does this from a shell, and
  `python -m ggufbridge.compare.exl3 quantize SRC OUT BITS` runs exllamav3's converter on such a view.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ggufbridge.errors import ConfigError, DeviceUnavailable, GGUFBridgeError
from ggufbridge.untrusted import load_json

ARCH = "MiniCPMV4_7ForConditionalGeneration"
# exllamav3 architecture strings that hold the Qwen3.5-MoE text model reading top-level config fields, newest
# first; the first one registered in the installed exllamav3 is used.
QWEN35_MOE_TEXT_ARCHS = ("Qwen3_5MoeForCausalLM",)
TEXT_ARCH = QWEN35_MOE_TEXT_ARCHS[0]
# config.json entries of the 4.7 wrapper that describe the vision side only (dropped in the text-only view).
VISION_KEYS = ("vision_config", "auto_map")


def text_only_config(config: dict) -> dict:
    """The 4.7 config.json as a Qwen3.5-MoE causal-LM config: text_config's fields at top level."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise GGUFBridgeError(f"config.json has no text_config object (architectures {config.get('architectures')})")
    out = {k: v for k, v in config.items() if k not in ("text_config", *VISION_KEYS)}
    out.update(text)
    out["architectures"] = [TEXT_ARCH]
    out["model_type"] = text.get("model_type", "qwen3_5_moe_text")
    return out


def text_only_view(src, dst) -> Path:
    """Folder `dst` holding symlinks to every file of `src` except config.json, which is the text-only config."""
    src, dst = Path(src).resolve(), Path(dst)
    cfg = load_json(src / "config.json", ConfigError, max_bytes=64 << 20, what="model configuration")
    archs = (cfg.get("architectures") if isinstance(cfg, dict) else None) or []
    if archs != [ARCH]:
        raise GGUFBridgeError(f"{src}/config.json: architectures must be [{ARCH!r}], found {archs}")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "config.json" or f.name.startswith("."):
            continue
        link = dst / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f)
    (dst / "config.json").write_text(json.dumps(text_only_config(cfg), indent=2, sort_keys=True) + "\n")
    return dst


def require_exllamav3():
    """(torch, exllamav3) if a CUDA device and exllamav3 are present; DeviceUnavailable saying which is not."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise DeviceUnavailable("exl3: needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            "exl3: exllamav3 needs a CUDA GPU and none is visible (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}); run on a GPU machine or dump the EXL3 logits there with "
            "`ggufbridge dump-logits --model exl3:DIR` and compare against logits:FILE here")
    try:
        import exllamav3
    except ImportError as e:
        raise DeviceUnavailable(f"exl3: exllamav3 is not importable ({e}); `pip install exllamav3==1.6.5` "
                                "(its CUDA extension compiles at first import; set TORCH_EXTENSIONS_DIR to cache it)"
                                ) from None
    return torch, exllamav3


def install_shim(architectures: dict | None = None) -> str:
    """Register ARCH in exllamav3's architecture table (idempotent); returns the base architecture used.

    `architectures` is exllamav3's table (`exllamav3.architecture.architectures.ARCHITECTURES`); tests pass a
    stand-in so the shim's logic is exercised without CUDA.
    """
    if architectures is None:
        from exllamav3.architecture.architectures import get_architectures

        architectures = get_architectures()
    if ARCH in architectures:
        return architectures[ARCH].get("shim_base", ARCH)
    base = next((a for a in QWEN35_MOE_TEXT_ARCHS if a in architectures), None)
    if base is None:
        raise GGUFBridgeError(f"exllamav3 registers none of {list(QWEN35_MOE_TEXT_ARCHS)}; the MiniCPM-V 4.7 shim "
                              "needs its Qwen3.5-MoE text model (exllamav3 1.6.5 has it)")
    entry = architectures[base]
    base_config = entry["config_class"]

    class MiniCPMV47TextConfig(base_config):
        """exllamav3's Qwen3.5-MoE config reading a MiniCPM-V 4.7 config.json (text_config lifted)."""

        arch_string = ARCH

        @property
        def config_dict(self):
            return self._shim_config_dict

        @config_dict.setter
        def config_dict(self, value):
            # Config.__init__ assigns the raw json here, then checks architectures[0] against arch_string and
            # reads every field through read_cfg: lift text_config but keep the 4.7 architecture name.
            if isinstance(value, dict) and isinstance(value.get("text_config"), dict):
                lifted = text_only_config(value)
                lifted["architectures"] = list(value.get("architectures") or [ARCH])
                value = lifted
            self._shim_config_dict = value

    architectures[ARCH] = {
        "architecture": ARCH,
        "config_class": MiniCPMV47TextConfig,
        "model_class": entry["model_class"],
        "shim_base": base,
    }
    return base


def storage_bpw(model) -> float | None:
    """Bits per weight of the pack's linear layers (exllamav3's own accounting), if it offers one."""
    fn = getattr(model, "get_storage_info", None)
    if fn is None:
        return None
    try:
        return float(fn()[0])
    except Exception:  # accounting differs between versions; the figure is informative only
        return None


def quantize(src, out, *, bits: float, head_bits: int = 6, work=None, cal_rows: int | None = None,
             cal_cols: int | None = None) -> Path:
    """Quantise a MiniCPM-V 4.7 checkpoint's text tower to an EXL3 pack with exllamav3's own converter, run on the
    text-only view (GPU machine only). Returns the pack folder."""
    require_exllamav3()
    from exllamav3.conversion import convert_model as cm

    out = Path(out)
    view = text_only_view(src, out.parent / f".{out.name}.textonly")
    work = Path(work) if work else out.parent / f".{out.name}.work"
    argv = ["-i", str(view), "-o", str(out), "-w", str(work), "-b", str(bits), "-hb", str(head_bits)]
    argv += ["-cr", str(cal_rows)] if cal_rows else []
    argv += ["-cc", str(cal_cols)] if cal_cols else []
    in_args, job_state, ok, err = cm.prepare(cm.parser.parse_args(argv))
    if not ok:
        raise GGUFBridgeError(f"exllamav3 convert: {err}")
    cm.main(in_args, job_state)
    return out


USAGE = """usage:
  python -m ggufbridge.compare.exl3 text-only SRC_CHECKPOINT DST_FOLDER
  python -m ggufbridge.compare.exl3 quantize SRC_CHECKPOINT OUT_PACK BITS [HEAD_BITS]"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) == 3 and argv[0] == "text-only":
            print(os.fspath(text_only_view(argv[1], argv[2])))
        elif len(argv) in (4, 5) and argv[0] == "quantize":
            head = int(argv[4]) if len(argv) == 5 else 6
            print(os.fspath(quantize(argv[1], argv[2], bits=float(argv[3]), head_bits=head)))
        else:
            print(USAGE, file=sys.stderr)
            return 2
    except (GGUFBridgeError, OSError, ValueError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
