from dataclasses import replace
from pathlib import Path
from ggufbridge.convert import convert
from ggufbridge.testkit.checkpoint import SPECS, make_minicpmv47
from ggufbridge.testkit import dspark as fx
root = Path('/tmp/gpu2'); root.mkdir(exist_ok=True)
spec = replace(SPECS["tiny"], linear_k_dim=16, linear_v_dim=16)  # CUDA GDN kernel: state sizes 16/32/64/128
pair = fx.make_oracle_pair(root / "oracle", target_spec=spec)
convert(pair.target_dir, "/work/main/.dev/gpu2/oracle", outtype="f16", draft=pair.draft_dir, draft_outtype="f16", mmproj=False, progress=False)
t = make_minicpmv47(root / "rand-target", spec, vocab="small")
d = fx.make_dspark(root / "rand-draft", t, "tiny")
convert(t, "/work/main/.dev/gpu2/random", outtype="f16", draft=d, draft_outtype="f16", mmproj=False, progress=False)
print(pair.lo, pair.n)
