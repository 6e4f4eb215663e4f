"""The exact-size arithmetic's header, both ways in one run: llama-quantize's output of the whole source (every tensor
kept at its type: a copy, what `--fit-bytes` did until 2026-12-05) against its output of the source's header twin
(ggufbridge.quant.probe.write_header_twin), per source: the two headers must be equal, and the time and the bytes
written are what the twin saves.

    python -m benchmarks.bench_header_twin SRC.gguf [SRC.gguf ...] [--work DIR] [--threads 2] [--out FILE.json]

Each way runs twice, alternating, and the faster run counts (the first touch of a source's pages is the page
cache's, not the method's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path


def copy_way(src: Path, work: Path, threads: int):
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant.filesize import HeaderModel
    from ggufbridge.quant.quantize import quantize_file
    from ggufbridge.quant.sensitivity import exact_mix, source_types

    h = read_header(src)
    out = work / "header-copy.gguf"
    t0 = time.perf_counter()
    quantize_file(src, out, mix=exact_mix("fit-header", h, source_types(h), "Q8_0"), threads=threads, internal=True)
    model = HeaderModel.measure(out)
    took, written = time.perf_counter() - t0, out.stat().st_size
    out.unlink()
    return model, took, written


def twin_way(src: Path, work: Path, threads: int):
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant.sensitivity import _measure_header

    h = read_header(src)
    t0 = time.perf_counter()
    model = _measure_header(h, work, None, threads, None)
    took = time.perf_counter() - t0
    twin = work / "twin-size.gguf"  # what the twin writes, measured apart from the timed run
    from ggufbridge.quant.probe import write_header_twin

    write_header_twin(h, twin)
    written = twin.stat().st_size
    twin.unlink()
    return model, took, written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", type=Path, nargs="+")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "header-twin-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for src in a.sources:
        best: dict[str, tuple] = {}
        for _ in range(2):
            for name, way in (("copy", copy_way), ("twin", twin_way)):
                got = way(src, a.work, a.threads)
                if name not in best or got[1] < best[name][1]:
                    best[name] = got
        (mc, tc, wc), (mt, tt, wt) = best["copy"], best["twin"]
        if mc != mt:
            print(f"{src}: the headers differ:\n  copy {mc}\n  twin {mt}", file=sys.stderr)
            return 1
        row = {"source": str(src), "source_bytes": src.stat().st_size, "header": asdict(mt), "copy_s": tc,
               "copy_bytes_written": wc, "twin_s": tt, "twin_bytes_written": wt, "ratio": tc / tt}
        rows.append(row)
        print(f"{src.name}: {src.stat().st_size / 1e9:.2f} GB; header {mt.unpadded:,} bytes, equal both ways; "
              f"on a copy {tc:.1f} s ({wc / 1e9:.2f} GB written), on the twin {tt:.2f} s ({wt / 1e6:.1f} MB): "
              f"{tc / tt:.1f}x", flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"threads": a.threads, "load": os.getloadavg(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
