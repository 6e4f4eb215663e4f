"""`convert()`: upstream checkpoint folder → GGUF files + manifest.json in an output folder.

Everything is written under temporary names and renamed into place only once every file is complete and
hashed, so an error or Ctrl-C at any point leaves no file under a final name.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ggufbridge.arch import draft_converter, mmproj_converter, text_converter
from ggufbridge.ggufio.plan import ConversionPlan, Note
from ggufbridge.checkpoint.model_dir import ModelDir, resolve_model_dir
from ggufbridge.errors import GGUFBridgeError, OutputError
from ggufbridge.ggufio import generation
from ggufbridge.ggufio.manifest import MANIFEST, ManifestEntry, write_manifest
from ggufbridge.files import sha256_file
from ggufbridge.ggufio.writer import FILE_TYPES, OUTTYPES, Written, remove_stale_parts, tmp_name, write_gguf
from ggufbridge.signals import deferred
from ggufbridge.ggufio.names import Keys

log = logging.getLogger(__name__)


@dataclass
class ConvertResult:
    out_dir: Path
    files: list[dict]
    notes: list[str]

    def path(self, role: str) -> Path:
        entry = next((f for f in self.files if f["role"] == role), None)
        if entry is None:
            raise GGUFBridgeError(f"no {role} file in {self.out_dir}")
        return self.out_dir / entry["path"]


def size_label(plan: ConversionPlan) -> str:
    """`35B-A3B` style: total parameters, and for MoE the parameters active per token (experts used / count)."""
    total = expert = 0
    for t in plan.tensors:
        n = 1
        for d in t.shape:
            n *= d
        total += n
        if "_exps." in t.name:
            expert += n
    kv = {k.key: k.value for k in plan.kvs}
    n_exp = kv.get(f"{plan.arch}.expert_count")
    used = kv.get(f"{plan.arch}.expert_used_count")
    label = _fmt(total, round)
    if expert and n_exp and used:
        label += "-A" + _fmt(total - expert + expert * used // n_exp, int)
    return label


def _fmt(n: int, rnd) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{max(1, rnd(n / scale))}{suffix}"
    return str(n)


def _readme_meta(model_dir: Path) -> dict:
    """license / base_model from a model card's YAML front matter (a tiny subset of YAML: enough for HF cards)."""
    readme = model_dir / "README.md"
    if not readme.is_file():
        return {}
    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"^---\n(.*?)\n---", text, re.S)
    if not m:
        return {}
    meta: dict = {}
    key = None
    for line in m.group(1).splitlines():
        if re.match(r"^[A-Za-z_]+:", line):
            key, _, val = line.partition(":")
            val = val.strip()
            meta[key] = val if val else []
        elif key and line.strip().startswith("- ") and isinstance(meta.get(key), list):
            meta[key].append(line.strip()[2:].strip())
    return meta


def add_general(plan: ConversionPlan, *, basename: str, size: str, outtype: str, model_dir: Path, role: str) -> None:
    plan.str(Keys.General.TYPE, "mmproj" if role == "mmproj" else "model")
    plan.str(Keys.General.NAME, f"{basename}-{size}" if role == "target" else f"{basename}-{size} ({role})")
    plan.str(Keys.General.BASENAME, basename)
    plan.str(Keys.General.SIZE_LABEL, size)
    plan.u32(Keys.General.FILE_TYPE, FILE_TYPES[outtype])
    plan.u32(Keys.General.QUANTIZATION_VERSION, 2)
    meta = _readme_meta(model_dir)
    if isinstance(meta.get("license"), str) and meta["license"]:
        plan.str(Keys.General.LICENSE, meta["license"])
    bases = meta.get("base_model")
    bases = [bases] if isinstance(bases, str) and bases else bases or []
    if bases:
        plan.u32(Keys.General.BASE_MODEL_COUNT, len(bases))
        for i, b in enumerate(bases):
            plan.str(Keys.General.BASE_MODEL_NAME.format(id=i), b.split("/")[-1])
            if "/" in b:
                plan.str(Keys.General.BASE_MODEL_ORGANIZATION.format(id=i), b.split("/")[0])
                plan.str(Keys.General.BASE_MODEL_REPO_URL.format(id=i), f"https://huggingface.co/{b}")


@dataclass
class Output:
    role: str  # "target" | "mmproj" | "draft"
    plan: ConversionPlan
    filename: str
    outtype: str


def plan_outputs(md: ModelDir, *, outtype: str, basename: str | None, draft=None, draft_outtype: str = "f16",
                 mmproj: bool = True, mmproj_outtype: str = "f16", downsample: str | None = None) -> list[Output]:
    """Decide every file to write, validating everything that can be validated before a byte is written."""
    for flag, val in (("--outtype", outtype), ("--draft-outtype", draft_outtype), ("--mmproj-outtype", mmproj_outtype)):
        if val not in OUTTYPES:
            raise GGUFBridgeError(f"{flag} must be one of {', '.join(OUTTYPES)}, found {val!r}")
    arch = text_converter(md.config)
    plan, params = arch.plan_target(md)
    plan.notes.insert(0, Note(f"target checkpoint: {md.layout} tensor-name layout"))
    basename = basename or arch.BASENAME
    size = size_label(plan)
    stem = f"{basename}-{size}"
    add_general(plan, basename=basename, size=size, outtype=outtype, model_dir=md.path, role="target")
    outputs = [Output("target", plan, f"{stem}-{outtype.upper()}.gguf", outtype)]
    # mmproj: the vision tower's converter, registered for the architecture (absent → text-only release).
    vision = mmproj_converter(md.config) if mmproj else None
    if vision is not None:
        vplan = vision.plan_mmproj(md, params.hidden, downsample=downsample)
        if vplan is not None:
            add_general(vplan, basename=basename, size=size, outtype=mmproj_outtype, model_dir=md.path, role="mmproj")
            outputs.append(Output("mmproj", vplan, f"mmproj-{stem}-{mmproj_outtype.upper()}.gguf", mmproj_outtype))
    if draft is not None:
        dmd = ModelDir.open(draft)
        drafter = draft_converter(dmd.config, f"{dmd.path.name}/config.json")
        dplan = drafter.plan_draft(dmd, target=md, target_plan=plan, target_params=params)
        dplan.notes.insert(0, Note(f"draft checkpoint: {dmd.layout} tensor-name layout"))
        add_general(dplan, basename=basename, size=size, outtype=draft_outtype, model_dir=dmd.path, role="draft")
        outputs.append(Output("draft", dplan, f"dspark-{stem}-{draft_outtype.upper()}.gguf", draft_outtype))
    return outputs


def convert(model_dir, out_dir, *, outtype: str = "f16", basename: str | None = None, draft=None,
            draft_outtype: str = "f16", mmproj: bool = True, mmproj_outtype: str = "f16",
            downsample: str | None = None, progress: bool = True, quant: str | None = None,
            mix: str | None = None, imatrix=None, revision: str | None = None, force: bool = False,
            allow_nonfinite: bool = False, fit: dict | None = None) -> ConvertResult:
    """`model_dir` and `draft`: a folder, a hub spec (`hf://ORG/NAME[@REV]`, `ms://ORG/NAME[@REV]`; downloaded
    first) or a repo id in the HF cache; `revision` pins `model_dir`'s.

    An `out_dir` that already holds a conversion (manifest.json or a GGUF) is refused unless `force`; with
    `force` the new conversion replaces the old one as a whole, once it is complete (files the old manifest lists
    and the new one does not are deleted). Weights holding NaN/Inf are refused unless `allow_nonfinite`."""
    from ggufbridge.quant import pipeline as qp  # quant=/mix=: the target goes through llama-quantize

    qlabel = (qp.prepare(quant, mix, imatrix, outtype, fit) if quant is not None or mix is not None or fit
              else None)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GGUFBridgeError(f"{out}: output path exists and is not a folder")
    if out.is_dir():  # before any download: what a dead earlier run left is settled first
        generation.recover(out)
        remove_stale_parts(out)
        existing = generation.existing_outputs(out)
        if existing and not force:
            raise OutputError(f"{out} already holds a conversion ({', '.join(existing[:3])}"
                              f"{', …' if len(existing) > 3 else ''}): refused; --force replaces it with this one")
    model_dir = resolve_model_dir(model_dir, revision=revision, progress=progress)
    if draft is not None:
        draft = resolve_model_dir(draft, progress=progress)
    md = ModelDir.open(model_dir)
    outputs = plan_outputs(md, outtype=outtype, basename=basename, draft=draft, draft_outtype=draft_outtype,
                           mmproj=mmproj, mmproj_outtype=mmproj_outtype, downsample=downsample)
    notes = [n for o in outputs for n in o.plan.notes]
    for note in notes:  # notes are logged here only, once, each at its level
        (log.warning if note.level == "warning" else log.info)(note.text)

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    written: list[tuple[str, Written, str]] = []
    manifest_tmp = tmp_name(out / MANIFEST)
    total = sum(t.source_bytes for o in outputs for t in o.plan.tensors)
    sources = sorted(p for p in md.path.iterdir() if p.is_file() and not p.name.startswith("."))
    # Hash the source files on a second thread while converting: hashlib releases the GIL on large buffers.
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        try:
            src_hashes = pool.map(sha256_file, sources)
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
                      desc="convert", leave=False) as bar:
                for o in outputs:
                    if o.role == "target" and qlabel:
                        w, _ = qp.write_quantized(o.plan, out / qp.quant_filename(o.filename, o.outtype, qlabel),
                                                  o.outtype, quant=quant, mix=mix, imatrix=imatrix,
                                                  progress=bar.update, allow_nonfinite=allow_nonfinite, fit=fit)
                        written.append((o.role, w, qlabel))
                        continue
                    w = write_gguf(o.plan, out / o.filename, o.outtype, progress=bar.update,
                                   allow_nonfinite=allow_nonfinite)
                    written.append((o.role, w, o.outtype))
            source = {s.name: h for s, h in zip(sources, src_hashes)}
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # interrupted: do not hash the rest of the checkpoint
        entries = [ManifestEntry.of(role, w.final, w.nbytes, w.sha256, otype.upper()) for role, w, otype in written]
        files = [e.to_dict() for e in entries]
        try:
            write_manifest(manifest_tmp, entries, source)
        except OSError as e:
            raise OutputError(f"cannot write {out / MANIFEST} (as {manifest_tmp.name}): {e.strerror or e}") from None
        with deferred():  # the renames are the commit: a signal waits until they are all done
            generation.commit(out, manifest_tmp, [(w.path, w.final) for _, w, _ in written])
            for _, w, _ in written:
                w.path = w.final
    except BaseException:
        # the pending manifest goes first: while it exists, recovery takes its temporary files as complete
        manifest_tmp.unlink(missing_ok=True)
        for _, w, _ in written:
            w.discard()
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    return ConvertResult(out, files, [n.text for n in notes])
