"""The architectures longseq reads from a config.json, each at a reduced size that keeps its code
paths (grouped-query attention, q/k norms, biases, sandwich norms, soft-capping, fused projections,
experts and shared experts): the real modelling code of transformers runs them."""

# Shared dimensions: 2 decoder layers (layer 1 is compared: layer 0 may hold what the model passes
# every layer), 4 query heads of 16 over 2 key/value heads, hidden 64, MLP 176, vocabulary 256.
_BASE = {"hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "vocab_size": 256, "head_dim": 16, "max_position_embeddings": 8192,
         "rope_theta": 10000.0, "tie_word_embeddings": False, "use_cache": False,
         # Token ids inside the small vocabulary (Phi-3's defaults, 32000, are not).
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

ARCHITECTURES = {
    "llama": dict(_BASE, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu"),
    "mistral": dict(_BASE, architectures=["MistralForCausalLM"], model_type="mistral", hidden_act="silu", sliding_window=None),
    "qwen2": dict(_BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu", use_sliding_window=False),
    "qwen3": dict(_BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu", use_sliding_window=False),
    "gemma2": dict(_BASE, architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=16, final_logit_softcapping=30.0, attn_logit_softcapping=None, sliding_window=4096,
                   tie_word_embeddings=True),
    "gemma3": dict(_BASE, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=16, final_logit_softcapping=None, sliding_window=4096, tie_word_embeddings=True),
    "phi3": dict(_BASE, architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_act="silu", num_key_value_heads=4),
    "mixtral": dict(_BASE, architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_act="silu", num_local_experts=4,
                    num_experts_per_tok=2, output_router_logits=False),
    "qwen2_moe": dict(_BASE, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_act="silu", num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=96, decoder_sparse_step=1,
                      mlp_only_layers=[], norm_topk_prob=False, output_router_logits=False),
    "qwen3_moe": dict(_BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_act="silu", num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[],
                      norm_topk_prob=True, output_router_logits=False),
}


def build_model(config: dict, gradient_checkpointing: bool = False, lora: dict | None = None,
                attn_implementation: str = "sdpa"):
    """`config`'s model from transformers' own modelling code, bf16, random weights (seed 0), in
    training mode: PEFT's LoRA adapters when `lora` (LoraConfig's arguments), transformers'
    non-reentrant gradient checkpointing when asked.

    Gemma 2 declares no SDPA (`_supports_sdpa = False`, modeling_gemma2.py: SDPA has no logit
    soft-capping) and on a GPU runs FlashAttention, which applies the cap inside its kernel and
    saves what it saves without one (q, k, v, the output, the log-sum-exp). The tiny Gemma 2 turns
    attention's soft-capping off (attn_logit_softcapping None), so SDPA computes the same attention
    and stands in for FlashAttention as it does for every other architecture here; the final logits'
    soft-capping (outside attention) stays on."""
    import contextlib
    from unittest import mock
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    hf_config.architectures = config["architectures"]
    model_class = AutoModelForCausalLM._model_mapping[type(hf_config)]
    with contextlib.ExitStack() as stack:
        if attn_implementation == "sdpa" and not model_class._supports_sdpa:
            assert getattr(hf_config, "attn_logit_softcapping", None) is None, \
                f"{model_class.__name__} has no SDPA: only with attention's soft-capping off can SDPA stand in for it"
            # The model and its inner decoder both check the flag their shared base class declares.
            declaring = next(c for c in model_class.__mro__ if "_supports_sdpa" in vars(c))
            stack.enter_context(mock.patch.object(declaring, "_supports_sdpa", True))
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16, attn_implementation=attn_implementation)
    if lora is not None:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(**lora))
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
