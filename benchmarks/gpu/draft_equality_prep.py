"""Tiny target + DSpark draft pairs for draft_equality.py: an oracle pair (the draft knows the target's greedy
continuation) and a random pair, converted into OUT/oracle and OUT/random.

    python3 -m benchmarks.gpu.draft_equality_prep OUT
"""
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from ggufbridge.convert import convert
from ggufbridge.testkit import dspark as fx
from ggufbridge.testkit.checkpoint import SPECS, make_minicpmv47

out = Path(sys.argv[1])
spec = replace(SPECS["tiny"], linear_k_dim=16, linear_v_dim=16)  # CUDA GDN kernel: state sizes 16/32/64/128
with tempfile.TemporaryDirectory(prefix="draft-equality-") as tmp:
    root = Path(tmp)
    pair = fx.make_oracle_pair(root / "oracle", target_spec=spec)
    convert(pair.target_dir, out / "oracle", outtype="f16", draft=pair.draft_dir, draft_outtype="f16", mmproj=False,
            progress=False, force=True)
    t = make_minicpmv47(root / "rand-target", spec, vocab="small")
    d = fx.make_dspark(root / "rand-draft", t, "tiny")
    convert(t, out / "random", outtype="f16", draft=d, draft_outtype="f16", mmproj=False, progress=False,
            force=True)
print(pair.lo, pair.n)
