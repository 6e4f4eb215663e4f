"""Hugging Face byte-level BPE tokenizer files → `tokenizer.*` GGUF metadata (docs/formats.md, "Tokenizer")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import TokenizerError
from ggufbridge.ggufio.names import Keys
from ggufbridge.textfile import read_utf8

# Pre-tokenizer regex (from tokenizer.json's Split step) → the runtime's pre-tokenizer name. The runtime only knows
# names, so a tokenizer whose regex is not in this table cannot be converted faithfully and is refused.
PRE_TOKENIZERS = {
    # Qwen3.5 / MiniCPM-V 4.6+: letters and combining marks together (\p{M}).
    (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
     r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""): "qwen35",
    # Qwen2 / Qwen3: the same without \p{M}.
    (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
     r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""): "qwen2",
}

# GGUF token types
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


@dataclass
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    chat_template: str | None
    ids: dict[str, int]

    def id_of(self, text: str) -> int | None:
        return self.ids.get(text)


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TokenizerError(f"{path.parent}: missing {path.name}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: unreadable tokenizer file ({e})") from None


def _split_regex(pre: dict | None) -> str | None:
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "Sequence":
        for step in pre.get("pretokenizers", []):
            found = _split_regex(step)
            if found:
                return found
        return None
    if pre.get("type") == "Split":
        pat = pre.get("pattern", {})
        return pat.get("Regex") or pat.get("String")
    return None


def _token_text(v) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return v.get("content")
    return None


def read_vocab(model_dir: Path, n_vocab: int) -> Vocab:
    """Read tokenizer.json (+ tokenizer_config.json, chat_template.jinja) and pad to the model's `n_vocab` rows."""
    tj = model_dir / "tokenizer.json"
    if not tj.is_file():
        raise TokenizerError(f"{model_dir}: missing tokenizer.json (the GGUF must carry the tokenizer)")
    data = _load(tj)
    # untrusted JSON: every container is checked for its kind before it is indexed
    if not isinstance(data, dict):
        raise TokenizerError(f"{tj}: expected a JSON object at the top level, found {type(data).__name__}")
    model = data.get("model") or {}
    if not isinstance(model, dict):
        raise TokenizerError(f"{tj}: model expected an object, found {type(model).__name__}")
    if model.get("type") != "BPE":
        raise TokenizerError(f"{tj}: model.type must be 'BPE' (byte-level), found {model.get('type')!r}")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{tj}: model.vocab is missing or empty")
    regex = _split_regex(data.get("pre_tokenizer"))
    pre = PRE_TOKENIZERS.get(regex or "")
    if pre is None:
        raise TokenizerError(
            f"{tj}: pre-tokenizer regex not known to the runtime (expected the Qwen3.5 pattern, found {regex!r:.80})"
        )

    by_id: dict[int, str] = {}
    special: set[int] = set()
    added_non_special: set[int] = set()
    for text, i in vocab.items():
        if not isinstance(i, int) or i < 0:
            raise TokenizerError(f"{tj}: token {text!r} has invalid id {i!r}")
        by_id[i] = text
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise TokenizerError(f"{tj}: added_tokens expected a list, found {type(added).__name__}")
    for at in added:
        if not isinstance(at, dict):
            raise TokenizerError(f"{tj}: malformed added token {at!r:.80}")
        i, text = at.get("id"), at.get("content")
        if not isinstance(i, int) or not isinstance(text, str) or i < 0:
            raise TokenizerError(f"{tj}: malformed added token {at!r:.80}")
        if i in by_id and by_id[i] != text:
            raise TokenizerError(f"{tj}: id {i} is both {by_id[i]!r} and added token {text!r}")
        by_id[i] = text
        (special if at.get("special") else added_non_special).add(i)

    top = max(by_id) + 1
    if top > n_vocab:
        raise TokenizerError(
            f"{tj}: token ids reach {top - 1}, but the model has only {n_vocab} embedding rows (config vocab_size)"
        )
    tokens, types, seen = [], [], set()
    for i in range(n_vocab):
        text = by_id.get(i)
        if text is None:
            text, typ = f"[PAD{i}]", UNUSED  # ids the model has rows for but the tokenizer never emits
        else:
            typ = CONTROL if i in special else USER_DEFINED if i in added_non_special else NORMAL
        if text in seen:
            raise TokenizerError(f"{tj}: token text {text!r} appears twice (the runtime needs unique tokens)")
        seen.add(text)
        tokens.append(text)
        types.append(typ)

    merges = []
    raw_merges = model.get("merges") or []
    if not isinstance(raw_merges, list):
        raise TokenizerError(f"{tj}: model.merges expected a list, found {type(raw_merges).__name__}")
    for k, m in enumerate(raw_merges):
        # two forms: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20)
        if isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            m = " ".join(m)
        if not isinstance(m, str):
            raise TokenizerError(f"{tj}: model.merges[{k}] expected \"a b\" or [\"a\", \"b\"], found {m!r:.60}")
        merges.append(m)
    if not merges:
        raise TokenizerError(f"{tj}: model.merges is missing or empty (byte-level BPE needs merges)")

    cfg_path = model_dir / "tokenizer_config.json"
    cfg = _load(cfg_path) if cfg_path.is_file() else {}
    if not isinstance(cfg, dict):
        raise TokenizerError(f"{cfg_path}: expected a JSON object at the top level, found {type(cfg).__name__}")
    ids = {t: i for i, t in enumerate(tokens)}

    def special_id(key: str, fallback: str | None) -> int | None:
        text = _token_text(cfg.get(key)) or fallback
        return ids.get(text) if text else None

    template = cfg.get("chat_template")
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        template = read_utf8(jinja, TokenizerError)
    if isinstance(template, list):  # named variants; the default one is the plain template
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return Vocab(
        tokens=tokens,
        types=types,
        merges=merges,
        pre=pre,
        bos_id=special_id("bos_token", "<|endoftext|>"),
        eos_id=special_id("eos_token", "<|im_end|>"),
        pad_id=special_id("pad_token", "<|endoftext|>"),
        chat_template=template if isinstance(template, str) and template else None,
        ids=ids,
    )


def add_vocab(plan, v: Vocab) -> None:
    """Tokenizer keys, typed as the runtime reads them."""
    plan.str(Keys.Tokenizer.MODEL, "gpt2")
    plan.str(Keys.Tokenizer.PRE, v.pre)
    plan.arr(Keys.Tokenizer.LIST, v.tokens)
    plan.arr(Keys.Tokenizer.TOKEN_TYPE, v.types)
    plan.arr(Keys.Tokenizer.MERGES, v.merges)
    ids = ((Keys.Tokenizer.BOS_ID, v.bos_id), (Keys.Tokenizer.EOS_ID, v.eos_id), (Keys.Tokenizer.PAD_ID, v.pad_id))
    for key, val in ids:
        if val is not None:
            plan.u32(key, val)
    plan.bool(Keys.Tokenizer.ADD_BOS, False)
    plan.bool(Keys.Tokenizer.ADD_EOS, False)
    if v.chat_template:
        plan.str(Keys.Tokenizer.CHAT_TEMPLATE, v.chat_template)
