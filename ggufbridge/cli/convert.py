"""`ggufbridge convert MODEL_DIR -o OUT_DIR` (MODEL_DIR: a folder, a hub spec or a repo id in the HF cache)."""

from __future__ import annotations

import click

from ggufbridge.cli import _options as opt
from ggufbridge.cli._common import writes_files
from ggufbridge.ggufio.writer import OUTTYPES

TYPES = click.Choice(sorted(OUTTYPES))


@click.command("convert")
@click.argument("model_dir")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--outtype", type=TYPES, default="f16", show_default=True,
              help="Type of the target's large weights; norms, router and SSM parameters always stay F32.")
@click.option("--revision", default=None, metavar="REV",
              help="Branch, tag or commit of a hub MODEL_DIR (same as hf://ORG/NAME@REV).")
@click.option("--draft", "draft", default=None, metavar="DIR|hf://ORG/NAME[@REV]",
              help="DSpark draft checkpoint (folder or hub spec): also write the draft GGUF.")
@click.option("--draft-outtype", type=TYPES, default="f16", show_default=True, help="Type of the draft's weights.")
@click.option("--mmproj/--no-mmproj", default=True, show_default=True, help="Also write the vision projector GGUF.")
@click.option("--mmproj-outtype", type=TYPES, default="f16", show_default=True, help="Type of the mmproj weights.")
@click.option("--downsample", type=click.Choice(["4x", "16x"]), default=None,
              help="Visual token compression of the mmproj [default: the checkpoint's].")
@click.option("--name", "basename", default=None, help="Base name of the output files [default: MiniCPM-V-4_7].")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar (bytes).")
@opt.quant_type("Quantise the target with llama-quantize (Q4_K_M, ...), starting from --outtype (bf16/f16/f32).")
@opt.mix()
@opt.imatrix("Importance matrix for --quant/--mix.")
@opt.fit_bytes(help="Quantise the target to the KL-guided mix whose file + KV cache for --fit-ctx fits this many "
                    "bytes (see `quantize --fit-bytes`).")
@click.option("--fit-ctx", type=click.IntRange(0, opt.INT32_MAX), default=None,
              help="Context to leave room for with --fit-bytes (0: the file alone) [default: 8192].")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="--fit-bytes: calibration text or .jsonl rows [default: a packaged sample].")
@click.option("--force", is_flag=True, help="OUT_DIR may hold a conversion already: replace it as a whole once "
              "the new one is complete (its files that the new manifest does not list are deleted).")
@click.option("--allow-nonfinite", is_flag=True, help="Write weights holding NaN/Inf as they are (with a warning) "
              "instead of refusing them.")
@writes_files
def command(model_dir, out_dir, outtype, revision, draft, draft_outtype, mmproj, mmproj_outtype, downsample, basename,
            progress, quant, mix, imatrix, fit_bytes, fit_ctx, calibration, force, allow_nonfinite):
    """Convert an upstream MiniCPM-V 4.7 checkpoint to GGUF files + manifest.json.

    MODEL_DIR is a folder; hf://ORG/NAME[@REV] (Hugging Face) or ms://ORG/NAME[@REV] (ModelScope), downloaded
    into that hub's cache (resumable; only configs, tokenizer and safetensors); or ORG/NAME, a repo already in
    the HF cache (offline).

    Files are written under temporary names and renamed together once all are complete; Ctrl-C, SIGTERM or an
    error leaves nothing under a final name, and a later run removes what a killed one left. An OUT_DIR that
    already holds a conversion (manifest.json or a .gguf) is refused unless --force."""
    from ggufbridge.convert import convert
    from ggufbridge.errors import QuantError

    if fit_bytes is None and (fit_ctx is not None or calibration is not None):
        raise QuantError("--fit-ctx and --calibration only apply with --fit-bytes")
    fit = {"fit_bytes": fit_bytes, "ctx": fit_ctx, "calibration": calibration} if fit_bytes is not None else None
    res = convert(model_dir, out_dir, outtype=outtype, basename=basename, draft=draft, draft_outtype=draft_outtype,
                  mmproj=mmproj, mmproj_outtype=mmproj_outtype, downsample=downsample, progress=progress,
                  quant=quant, mix=mix, imatrix=imatrix, revision=revision, force=force,
                  allow_nonfinite=allow_nonfinite, fit=fit)
    for f in res.files:
        click.echo(f"{f['role']:7s} {res.out_dir / f['path']}  {f['bytes'] / 2**20:.1f} MiB  {f['type']}")
    click.echo(f"manifest {res.out_dir / 'manifest.json'}")
