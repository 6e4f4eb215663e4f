#!/usr/bin/env python3
"""sha256 of every GGUF that `convert` writes for the demo's checkpoint and the tests' fixtures, to show that a
change leaves conversions byte-identical.

The checkpoints are the synthetic ones of ggufbridge.testkit (same seed, so the same bytes on every machine with
the same transformers): the demo's (tiny spec, real vocabulary, F32 and Q8_0, with the mmproj; a DSpark draft
beside the F32 one) and the shapes and types the tests convert most (small vocabulary: F16 with a draft, BF16,
the K-quant-safe BF16 model, the 4x-downsampling vision tower).

    .venv/bin/python -m benchmarks.conversion_hashes --save before.json     # on the old tree
    .venv/bin/python -m benchmarks.conversion_hashes --check before.json    # on the new: exit 1 on any change

Another tree's code is measured with PYTHONPATH=/path/to/that/tree (its ggufbridge is imported first).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

# (spec, make_minicpmv47 keywords, convert outtype, with a DSpark draft)
CASES = [
    ("tiny", {}, "f32", True),
    ("tiny", {}, "q8_0", False),
    ("tiny", {"vocab": "small"}, "f16", True),
    ("tiny", {"vocab": "small", "dtype": "bfloat16"}, "bf16", False),
    ("ksafe", {"vocab": "small", "dtype": "bfloat16"}, "bf16", False),
    ("tiny4x", {"vocab": "small"}, "f32", False),
]


def hashes(work: Path) -> dict[str, str]:
    from tqdm import tqdm

    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import make_minicpmv47
    from ggufbridge.testkit.dspark import make_dspark

    out: dict[str, str] = {}
    for spec, kw, outtype, with_draft in tqdm(CASES, desc="conversions", unit="case"):
        name = "-".join([spec] + [f"{k}={v}" for k, v in kw.items()])
        ckpt = work / "ckpt" / name
        if not (ckpt / "config.json").is_file():
            make_minicpmv47(ckpt, spec, **kw)
        draft = None
        if with_draft:
            draft = work / "ckpt" / f"{name}-draft"
            if not (draft / "config.json").is_file():
                make_dspark(draft, ckpt, "tiny")
        dest = work / "out" / f"{name}-{outtype}"
        convert(ckpt, dest, outtype=outtype, draft=draft, progress=False, force=True)
        for f in sorted(dest.glob("*.gguf")):
            out[f"{dest.name}/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=None, help="where checkpoints and outputs go (default: temporary)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--save", type=Path, help="write the hashes to this JSON file")
    group.add_argument("--check", type=Path, help="compare with the hashes in this JSON file; exit 1 on a change")
    args = ap.parse_args()
    import ggufbridge

    print(f"ggufbridge from {Path(ggufbridge.__file__).parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="ggufbridge-hashes-") as tmp:
        got = hashes(args.work or Path(tmp))
    if args.save:
        args.save.write_text(json.dumps(got, indent=1) + "\n")
        print(f"{len(got)} files: hashes written to {args.save}")
        return 0
    if args.check:
        want = json.loads(args.check.read_text())
        changed = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        for k in changed:
            print(f"changed: {k}  {want.get(k, 'absent')[:16]} -> {got.get(k, 'absent')[:16]}")
        print(f"{len(got)} files: {'all byte-identical' if not changed else f'{len(changed)} changed'}")
        return 1 if changed else 0
    for k, v in got.items():
        print(f"{v}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
