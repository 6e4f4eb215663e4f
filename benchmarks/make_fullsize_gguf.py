"""A full-size-shaped, random-weight MiniCPM-V 4.7 35B-A3B text target + DSpark draft, written straight as GGUF
(the builder is ggufbridge.testkit.fullsize, which tests/test_fullsize_gguf.py checks; its docstring has the
details).

    python -m benchmarks.make_fullsize_gguf OUT_DIR --tokenizer DIR [--quant q4_k_m] [--layers N] [--oracle]
                                             [--no-draft] [--smoke]
"""

import sys

from ggufbridge.testkit.fullsize import main

if __name__ == "__main__":
    sys.exit(main())
