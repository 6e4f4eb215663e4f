"""scripts/build_ui.sh without npm: one line says so, nothing is printed as a page (so build_runtime.sh builds
llama-server without it), and a page already built for these UI sources is still found (no npm needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_ui.sh"
TOOLS = ("bash", "find", "sort", "xargs", "sha256sum", "cut", "cat", "mkdir", "flock", "tar", "rm", "mv")


def _run(src: Path, cache: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(src), str(cache)], capture_output=True, text=True,
                          env=dict(os.environ, PATH=str(bin_dir)), timeout=60)


def test_without_npm_one_line_and_no_page(tmp_path):
    src = tmp_path / "ui"
    (src / "src").mkdir(parents=True)
    (src / "package-lock.json").write_text("{}")
    (src / "src" / "app.ts").write_text("export {}")
    bin_dir = tmp_path / "bin"  # a PATH with the script's tools and no npm
    bin_dir.mkdir()
    for t in TOOLS:
        (bin_dir / t).symlink_to(shutil.which(t))
    r = _run(src, tmp_path / "cache", bin_dir)
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "npm not found" in r.stderr and "without its chat page" in r.stderr

    # the same sources built earlier (here: the page placed where a build leaves it) need no npm
    key = subprocess.run(["bash", "-c", "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum"],
                         cwd=src, capture_output=True, text=True).stdout[:12]
    page = tmp_path / "cache" / f"page-{key}"
    page.mkdir(parents=True)
    (page / "index.html").write_text("<html></html>")
    r = _run(src, tmp_path / "cache", bin_dir)
    assert r.returncode == 0 and r.stdout.strip() == str(page) and r.stderr == ""

    # a changed source is another page: without npm, none
    (src / "src" / "app.ts").write_text("export const x = 1")
    r = _run(src, tmp_path / "cache", bin_dir)
    assert r.stdout == "" and "npm not found" in r.stderr
