"""Chat templates for the client-facing tests, and a converted tiny model that carries one.

QWEN35_TEMPLATE is the Qwen3.5 family's public template (origin in tests/data/templates/README.md). A model
converted from a checkpoint whose chat_template.jinja is that template carries it in its GGUF
(tokenizer.chat_template), so llama-server's reasoning and tool-call parsers see what a real Qwen3.5-family
model gives them; the fixture's 764-byte template renders no reasoning in history and no tools, so the
runtime finds no thinking markers in it and extracts nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

QWEN35_TEMPLATE_PATH = Path(__file__).parent / "data" / "templates" / "Qwen3.5-4B.jinja"
QWEN35_TEMPLATE = QWEN35_TEMPLATE_PATH.read_text(encoding="utf-8")

_CACHE: dict = {}


def converted_with_template(make_ckpt, tmp_path_factory, template: str = QWEN35_TEMPLATE) -> tuple[Path, Path]:
    """(checkpoint folder, convert OUT_DIR) of the tiny fixture (small vocabulary) with `template` as its template."""
    if template not in _CACHE:
        from ggufbridge.convert import convert

        root = tmp_path_factory.mktemp("templated")
        ckpt = root / "ckpt"
        shutil.copytree(make_ckpt("tiny", vocab="small"), ckpt)  # the shared fixture folder stays read-only
        (ckpt / "chat_template.jinja").write_text(template, encoding="utf-8")
        convert(ckpt, root / "out", outtype="f32", progress=False)
        _CACHE[template] = (ckpt, root / "out")
    return _CACHE[template]
