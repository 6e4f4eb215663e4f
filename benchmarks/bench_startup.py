"""Start-up of the commands that read GGUF headers before loading a model (docs/benchmarks.md, "Start-up").

    benchmarks/bench_startup.py OUT_DIR [--base-rev REV] [--reps 2] [--image IMG]

OUT_DIR is a convert output (e.g. `ggufbridge demo --dir W` → W/parity/f32, or W/model with its mmproj and
draft). Each command runs under
`/usr/bin/time -v` (wall, max RSS); with --base-rev the same commands also run on that git revision (exported to
a temporary folder, imported ahead of the installed package), interleaved with this tree's, so that both see the
same machine load. The anchor (Python start-up + `import ggufbridge.cli`) is measured in the same run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# runs the CLI (or code) of the tree it is started in (`-c` puts the working folder first on the path); with
# GB_BASE set (another tree) the editable install's finder is taken out of the way first
LAUNCH = ("import os, sys\nif os.environ.get('GB_BASE'):\n"
          "    sys.meta_path[:] = [f for f in sys.meta_path\n"
          "                        if 'editable' not in (getattr(f, '__module__', '') or '')]\n")
CLI = LAUNCH + "from ggufbridge.cli import main\nsys.argv = ['ggufbridge'] + sys.argv[1:]\nmain()\n"


def timed(argv: list[str], env: dict, cwd: Path) -> tuple[float, int, int]:
    res = subprocess.run(["/usr/bin/time", "-v", *argv], env=env, cwd=cwd, capture_output=True, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time .*: (?:(\d+):)?(\d+):([\d.]+)", res.stderr)
    h, m, sec = (float(g) if g else 0.0 for g in wall.groups())
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr).group(1))
    return 3600 * h + 60 * m + sec, rss // 1024, res.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--base-rev", help="also run this git revision, interleaved")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--image", type=Path, help="an image for `run --image` (default: a generated 80×64 PNG)")
    a = ap.parse_args()
    import os

    import numpy as np
    from PIL import Image

    from ggufbridge.ggufio.manifest import read_manifest

    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    image = a.image or tmp / "img.png"
    if a.image is None:
        Image.fromarray((np.random.default_rng(0).random((64, 80, 3)) * 255).astype("uint8")).save(image)
    target = read_manifest(a.out_dir).files["target"].path
    py, out = sys.executable, str(a.out_dir)
    facts = LAUNCH + f"from ggufbridge.compare.sources import gguf_facts\ngguf_facts({str(target)!r})\n"
    commands = {
        "anchor: import ggufbridge.cli": [py, "-c", "import ggufbridge.cli"],
        "plan OUT": [py, "-c", CLI, "plan", out],
        "serve OUT --dry-run": [py, "-c", CLI, "serve", out, "--dry-run"],
        "run OUT -p hi -n 2": [py, "-c", CLI, "run", out, "-p", "hi", "-n", "2"],
        "run OUT --image IMG -n 2": [py, "-c", CLI, "run", out, "-p", "what is this", "-n", "2", "--image", str(image)],
        "compare's gguf_facts(target)": [py, "-c", facts],
    }
    trees = {"this tree": None}
    if a.base_rev:
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", a.base_rev], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        trees = {a.base_rev: str(base), **trees}
    print("| command | " + " | ".join(trees) + " |")
    print("|---|" + "---|" * len(trees))
    for name, argv in commands.items():
        cells = {t: [] for t in trees}
        for _ in range(a.reps):
            for t, base in trees.items():
                env = dict(os.environ, **({"GB_BASE": base} if base else {}))
                wall, rss, rc = timed(argv, env, Path(base) if base else ROOT)
                cells[t].append(f"{wall:.2f} s, {rss} MB" + ("" if rc == 0 else f" (exit {rc})"))
        print(f"| {name} | " + " | ".join(" / ".join(v) for v in cells.values()) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
