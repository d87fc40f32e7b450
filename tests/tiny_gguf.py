"""A tiny Llama-family model written as a GGUF file, as llama.cpp's converter lays it out: llama metadata,
the byte-level vocabulary as a ``gpt2`` tokenizer, q/k rows permuted to llama.cpp's RoPE order (which
transformers' GGUF loading undoes), the matrices in Q8_0 blocks (so reading it dequantises, as a real
GGUF's does; ``types`` gives some another type, as a Q4_K_M file mixes them) and the norms and the
embedding in F32. Tests read it through ``load_model``."""

from pathlib import Path

import gguf
import numpy as np

#: HF module path (inside a decoder layer) → GGUF tensor name (``blk.N.<name>.weight``)
_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (its convert_hf_to_gguf ``LlamaModel.permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(lm, path: Path, types: dict[str, str] | None = None, matrices: str = "Q8_0") -> Path:
    """``lm`` (a loaded LlamaForCausalLM with the tiny models' byte tokenizer) as a GGUF at ``path``: its
    matrices in ``matrices`` blocks, those named in ``types`` (GGUF name → type name) in theirs."""
    c = lm.model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(lm.name)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    vocab = [t for t, _ in sorted(lm.tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([gguf.TokenType.NORMAL] * len(vocab))
    w.add_token_scores([0.0] * len(vocab))  # no merges: transformers derives them (none) from these
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_pad_token_id(0)
    for name, t in lm.model.state_dict().items():
        a = t.float().numpy()
        if name in _TOP:
            out = _TOP[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            module = rest.rsplit(".", 1)[0]
            out = f"blk.{layer}.{_LAYER[module]}.weight"
            if module == "self_attn.q_proj":
                a = _permute(a, c.num_attention_heads)
            elif module == "self_attn.k_proj":
                a = _permute(a, c.num_key_value_heads)
        if a.ndim == 2 and out != "token_embd.weight":
            kind = gguf.GGMLQuantizationType[(types or {}).get(out, matrices)]
            w.add_tensor(out, gguf.quants.quantize(a, kind), raw_dtype=kind)
        else:
            w.add_tensor(out, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
