"""`write_quantized`: the converter's path to a quantised target — write the plan at high precision under a
temporary name, quantise that into the final file's temporary name, drop the intermediate. The caller keeps the
atomic rename (`Written.commit()`), exactly as for an unquantised file."""

from __future__ import annotations

import os
from pathlib import Path

from ggufbridge.errors import QuantError
from ggufbridge.quant import types as qt
from ggufbridge.quant.quantize import QuantResult, quantize_file
from ggufbridge.files import sha256_file

INTERMEDIATE_TYPES = ("bf16", "f16", "f32")


def quant_label(quant: str | None, mix: str | None) -> str:
    """What a quantised file's name and manifest entry say: the llama-quantize type, or the mix's name in capitals."""
    if (quant is None) == (mix is None):
        raise QuantError("give exactly one of --quant and --mix")
    return qt.file_type(quant) if quant is not None else Path(mix).stem.upper()


def quant_filename(filename: str, outtype: str, label: str) -> str:
    """`NAME-BF16.gguf` → `NAME-HQ4.gguf`."""
    suffix = f"-{outtype.upper()}.gguf"
    stem = filename[: -len(suffix)] if filename.endswith(suffix) else filename.removesuffix(".gguf")
    return f"{stem}-{label}.gguf"


def check_intermediate(outtype: str) -> None:
    if outtype not in INTERMEDIATE_TYPES:
        raise QuantError(f"--outtype is the precision quantisation starts from: expected one of "
                         f"{', '.join(INTERMEDIATE_TYPES)} with --quant/--mix, found {outtype!r}")


FIT_LABEL = "FIT"  # file name / manifest type of a KL-guided mix (`convert --fit-bytes`)


def prepare(quant: str | None, mix: str | None, imatrix, outtype: str, fit: dict | None = None) -> str:
    """Validate a convert-time quantisation request before anything is written; returns its label.
    `fit`: keyword arguments of ggufbridge.quant.optimise.fit_quantize (fit_bytes, ctx, calibration, ...)."""
    from ggufbridge.quant.mix import load_mix
    from ggufbridge.runtime.locate import locate

    if fit is not None:
        if quant is not None or mix is not None:
            raise QuantError("give one of --quant, --mix and --fit-bytes")
        if fit.get("calibration") is not None and not Path(fit["calibration"]).is_file():
            raise QuantError(f"calibration set {fit['calibration']} does not exist")
        label = FIT_LABEL
    else:
        label = quant_label(quant, mix)
    check_intermediate(outtype)
    if mix is not None:
        load_mix(mix)
    if imatrix is not None and not Path(imatrix).is_file():
        raise QuantError(f"importance matrix {imatrix} does not exist")
    locate().tool("llama-quantize")
    return label


def write_quantized(plan, final: Path, outtype: str, *, quant: str | None = None, mix: str | None = None,
                    imatrix=None, progress=None, threads: int | None = None, allow_nonfinite: bool = False,
                    fit: dict | None = None):
    """Returns (Written for `final`, still under its temporary name, QuantResult). With `fit`, the mix is chosen
    for the budget on the intermediate file (ggufbridge.quant.optimise) and written beside `final` as
    NAME.mix.toml."""
    from ggufbridge.ggufio.writer import Written, tmp_name, write_gguf

    check_intermediate(outtype)
    hp = write_gguf(plan, final.with_name(f"{final.stem}.{outtype}-intermediate.gguf"), outtype, progress=progress,
                    allow_nonfinite=allow_nonfinite)
    dst = tmp_name(final)
    try:
        if fit is not None:
            from ggufbridge.quant.optimise import fit_quantize

            res = fit_quantize(hp.path, dst, imatrix=imatrix, threads=threads,
                               mix_out=final.with_name(final.stem + ".mix.toml"), **fit)[0]
        else:
            res = quantize_file(hp.path, dst, quant=quant, mix=mix, imatrix=imatrix, threads=threads,
                                    progress=progress is not None)
    except BaseException:
        dst.unlink(missing_ok=True)
        raise
    finally:
        hp.discard()
    types: dict[str, int] = {}
    for row in res.report.rows:
        for t, n in row.types.items():
            types[t] = types.get(t, 0) + n
    return Written(dst, final, os.path.getsize(dst), sha256_file(dst), types), res


def quantize_gguf(src, dst, *, quant: str | None = None, mix: str | None = None, fit_bytes: int | None = None,
                  fit: str | None = None, ctx: int | None = None, calibration=None, reference: str | None = None,
                  mix_out=None, work=None, imatrix=None, threads: int | None = None, allow_requantize: bool = False,
                  progress: bool = False, fit_budget_time: float | None = None, calibration_tokens: int | None = None,
                  fit_probes: str | None = None, report=None) -> tuple[QuantResult, str | None]:
    """What `ggufbridge quantize` does: `src` into `dst`, all or nothing, by exactly one of a llama-quantize type
    (`quant`), a mix (`mix`), or a KL-guided mix for a byte budget (`fit_bytes`) or a hardware recipe (`fit`).
    Returns the result and, for the KL-guided mixes, one line saying which mix was chosen and where it was
    written (`mix_out`, default DST with .mix.toml). `fit_budget_time` (seconds) bounds the sensitivity pass,
    `calibration_tokens` cuts its calibration, `fit_probes` says how its probes run; `report` receives its cost
    estimate, line by line, before it runs."""
    from ggufbridge.quant.quantize import all_or_nothing, quantize_to

    given = [n for n, v in (("--quant", quant), ("--mix", mix), ("--fit-bytes", fit_bytes),
                            ("--fit", fit)) if v is not None]
    if len(given) != 1:
        raise QuantError(f"give exactly one of --quant, --mix, --fit-bytes, --fit; "
                         f"found {', '.join(given) or 'none'}")
    fitting = fit_bytes is not None or fit is not None
    if not fitting:
        for name, v in (("--ctx", ctx), ("--calibration", calibration), ("--reference", reference),
                        ("--mix-out", mix_out), ("--work", work), ("--fit-budget-time", fit_budget_time),
                        ("--calibration-tokens", calibration_tokens), ("--fit-probes", fit_probes)):
            if v is not None:
                raise QuantError(f"{name} only applies with --fit or --fit-bytes")
        return quantize_to(src, dst, quant=quant, mix=mix, imatrix=imatrix, threads=threads,
                           allow_requantize=allow_requantize, progress=progress), None
    from ggufbridge.quant.optimise import fit_quantize

    mix_out = Path(mix_out) if mix_out else Path(dst).with_suffix(".mix.toml")
    with all_or_nothing(dst, src, imatrix, calibration) as tmp:
        res, plan, sens = fit_quantize(src, tmp, fit_bytes=fit_bytes, hardware=fit, ctx=ctx,
                                       calibration=calibration, reference=reference, imatrix=imatrix,
                                       work=work, mix_out=mix_out, threads=threads, progress=progress,
                                       budget_s=fit_budget_time, report=report,
                                       calibration_tokens=calibration_tokens, probes=fit_probes or "auto")
    res.path, res.report.path = Path(dst), str(dst)
    if fit is not None:  # plan.budget is where the search stopped, not a budget anyone set: say what was fitted
        from ggufbridge.quant.optimise import DEFAULT_CTX

        room = (f", the largest mix that fits recipe {fit}'s GPU memory with one slot of "
                f"{DEFAULT_CTX if ctx is None else ctx} tokens")
    else:
        room = f" of {plan.budget:,} for the file"
    return res, (f"mix {plan.mix.name}: {plan.file_bytes:,} bytes{room}; predicted KL "
                 f"{plan.predicted_kl:.4f} (sensitivity over {sens.n_tokens} tokens vs {sens.reference}); recipe "
                 f"written to {mix_out}")
