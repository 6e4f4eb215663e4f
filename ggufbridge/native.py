"""llama.cpp's own log lines from the in-process bindings (llama_cpp), shown only with `ggufbridge -v`.

`Llama(..., verbose=False)` still lets some of the library's lines through to stderr (creating a context logs
`llama_context: n_ctx_seq (...) > n_ctx_train (...)` whatever the bindings' log level): they land in the middle of
`imatrix` and `quantize --fit` output. `quiet_native()` points file descriptor 2 at /dev/null for the block, unless
ggufbridge's logger is at debug level (-v); errors still surface as the exceptions the bindings raise.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager


@contextmanager
def quiet_native():
    if logging.getLogger("ggufbridge").isEnabledFor(logging.DEBUG):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
