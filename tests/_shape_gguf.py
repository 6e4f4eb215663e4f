"""A random-weight qwen35moe / dflash GGUF of chosen shapes, written directly with gguf-py.

Only for tests that check the memory planner against the runtime's own buffer sizes: the planner reads
shapes from GGUF headers, and the runtime reports what it allocated for the same file. Weights are noise;
the converter's output is used wherever model behaviour matters.
"""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter, GGUFValueType


def _byte_tokens() -> list[str]:
    # GPT-2 byte-to-unicode table: every byte gets a printable stand-in
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def _tokenizer(w: GGUFWriter, n_vocab: int, mask: bool = False) -> None:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
    toks = _byte_tokens()
    toks += [f"[PAD{i}]" for i in range(n_vocab - len(toks) - len(specials))] + specials
    types = [1] * 256 + [5] * (n_vocab - 256 - len(specials)) + [3] * len(specials)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35")
    w.add_array("tokenizer.ggml.tokens", toks)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", ["Ġ t", "h e"])
    w.add_uint32("tokenizer.ggml.eos_token_id", n_vocab - 2)
    w.add_uint32("tokenizer.ggml.bos_token_id", n_vocab - 4)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    if mask:
        w.add_uint32("tokenizer.ggml.mask_token_id", n_vocab - 1)


def write_qwen35moe(path, *, n_embd=64, layer_types="LLLF", n_head=4, n_head_kv=2, head_dim=16, n_rot=4,
                    n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff_shexp=32, d_state=8, n_group=2, n_v_heads=4,
                    d_conv=4, n_vocab=512, n_ctx=4096, seed=0) -> None:
    rng = np.random.default_rng(seed)

    def t(*shape):  # numpy shape (reverse of ggml)
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    n_layer = len(layer_types)
    d_inner = d_state * n_v_heads
    conv_dim = 2 * d_state * n_group + d_inner
    w = GGUFWriter(str(path), "qwen35moe")
    p = "qwen35moe."
    for key, val in (("block_count", n_layer), ("context_length", n_ctx), ("embedding_length", n_embd),
                     ("expert_feed_forward_length", n_ff_exp), ("expert_shared_feed_forward_length", n_ff_shexp),
                     ("expert_count", n_expert), ("expert_used_count", n_expert_used),
                     ("attention.head_count", n_head), ("attention.head_count_kv", n_head_kv),
                     ("attention.key_length", head_dim), ("attention.value_length", head_dim),
                     ("rope.dimension_count", n_rot), ("ssm.conv_kernel", d_conv), ("ssm.state_size", d_state),
                     ("ssm.group_count", n_group), ("ssm.time_step_rank", n_v_heads), ("ssm.inner_size", d_inner)):
        w.add_uint32(p + key, val)
    w.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(p + "rope.freq_base", 10000.0)
    w.add_array(p + "rope.dimension_sections", [n_rot // 4, n_rot // 4, 0, 0])
    w.add_key_value(p + "attention.recurrent_layers", [c == "L" for c in layer_types], GGUFValueType.ARRAY,
                    GGUFValueType.BOOL)
    _tokenizer(w, n_vocab)
    w.add_tensor("token_embd.weight", t(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output.weight", t(n_vocab, n_embd))
    for i, kind in enumerate(layer_types):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(b + "post_attention_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(b + "ffn_gate_inp.weight", t(n_expert, n_embd))
        w.add_tensor(b + "ffn_gate_exps.weight", t(n_expert, n_ff_exp, n_embd))
        w.add_tensor(b + "ffn_up_exps.weight", t(n_expert, n_ff_exp, n_embd))
        w.add_tensor(b + "ffn_down_exps.weight", t(n_expert, n_embd, n_ff_exp))
        w.add_tensor(b + "ffn_gate_inp_shexp.weight", t(n_embd))
        w.add_tensor(b + "ffn_gate_shexp.weight", t(n_ff_shexp, n_embd))
        w.add_tensor(b + "ffn_up_shexp.weight", t(n_ff_shexp, n_embd))
        w.add_tensor(b + "ffn_down_shexp.weight", t(n_embd, n_ff_shexp))
        if kind == "L":
            w.add_tensor(b + "attn_qkv.weight", t(conv_dim, n_embd))
            w.add_tensor(b + "attn_gate.weight", t(d_inner, n_embd))
            w.add_tensor(b + "ssm_conv1d.weight", t(conv_dim, d_conv))
            w.add_tensor(b + "ssm_dt.bias", t(n_v_heads))
            w.add_tensor(b + "ssm_a", -np.ones(n_v_heads, np.float32))
            w.add_tensor(b + "ssm_beta.weight", t(n_v_heads, n_embd))
            w.add_tensor(b + "ssm_alpha.weight", t(n_v_heads, n_embd))
            w.add_tensor(b + "ssm_norm.weight", np.ones(d_state, np.float32))
            w.add_tensor(b + "ssm_out.weight", t(n_embd, d_inner))
        else:
            w.add_tensor(b + "attn_q.weight", t(2 * head_dim * n_head, n_embd))
            w.add_tensor(b + "attn_k.weight", t(head_dim * n_head_kv, n_embd))
            w.add_tensor(b + "attn_v.weight", t(head_dim * n_head_kv, n_embd))
            w.add_tensor(b + "attn_output.weight", t(n_embd, head_dim * n_head))
            w.add_tensor(b + "attn_q_norm.weight", np.ones(head_dim, np.float32))
            w.add_tensor(b + "attn_k_norm.weight", np.ones(head_dim, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _copy_tokenizer(w: GGUFWriter, target_gguf) -> int:
    """Copy every tokenizer.* key of a target GGUF (a DSpark draft shares its target's vocabulary);
    the mask token is the last id. Returns the vocabulary size."""
    from gguf import GGUFReader

    r = GGUFReader(str(target_gguf), "r")
    n_vocab = 0
    for f in r.fields.values():
        if not f.name.startswith("tokenizer.") or f.name == "tokenizer.ggml.mask_token_id":
            continue
        val = f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(f.name, val, GGUFValueType.ARRAY, f.types[1])
        else:
            w.add_key_value(f.name, val, f.types[0])
        if f.name == "tokenizer.ggml.tokens":
            n_vocab = len(val)
    w.add_uint32("tokenizer.ggml.mask_token_id", n_vocab - 1)
    return n_vocab


def write_dspark(path, *, n_embd=64, n_layer=1, n_head=4, n_head_kv=2, head_dim=16, n_ff=64, rank=16,
                 block_size=4, target_layers=(1, 2), n_vocab=512, n_ctx=4096, seed=1, tokenizer_from=None) -> None:
    rng = np.random.default_rng(seed)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = GGUFWriter(str(path), "dflash")
    p = "dflash."
    for key, val in (("block_count", n_layer), ("context_length", n_ctx), ("embedding_length", n_embd),
                     ("feed_forward_length", n_ff), ("attention.head_count", n_head),
                     ("attention.head_count_kv", n_head_kv), ("attention.key_length", head_dim),
                     ("attention.value_length", head_dim), ("block_size", block_size)):
        w.add_uint32(p + key, val)
    w.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_array(p + "target_layers", list(target_layers))
    if tokenizer_from is not None:
        n_vocab = _copy_tokenizer(w, tokenizer_from)
    else:
        _tokenizer(w, n_vocab, mask=True)
    nt = len(target_layers)
    w.add_tensor("fc.weight", t(n_embd, nt * n_embd))
    w.add_tensor("enc.output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(b + "attn_q.weight", t(head_dim * n_head, n_embd))
        w.add_tensor(b + "attn_k.weight", t(head_dim * n_head_kv, n_embd))
        w.add_tensor(b + "attn_v.weight", t(head_dim * n_head_kv, n_embd))
        w.add_tensor(b + "attn_output.weight", t(n_embd, head_dim * n_head))
        w.add_tensor(b + "attn_q_norm.weight", np.ones(head_dim, np.float32))
        w.add_tensor(b + "attn_k_norm.weight", np.ones(head_dim, np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(b + "ffn_gate.weight", t(n_ff, n_embd))
        w.add_tensor(b + "ffn_up.weight", t(n_ff, n_embd))
        w.add_tensor(b + "ffn_down.weight", t(n_embd, n_ff))
    w.add_tensor("markov_w1.weight", t(n_vocab, rank))
    w.add_tensor("markov_w2.weight", t(n_vocab, rank))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
