"""--emit megatron-core, read by Megatron-LM itself: the arguments of the pretrain_gpt.py launch
script parsed by Megatron-LM's own parse_args and checked by its validate_args
(megatron/training/arguments.py, as megatron-core 0.19.2's wheel ships it) in a world of the planned
size, with the environment the script exports; then the parallel layout Megatron derives from them
(data-parallel size, context parallelism, its communication type) held to the plan.
scripts/frameworks-check.sh installs that wheel into its own folder (requirements-megatron.txt) and
names it in LONGSEQ_MEGATRON_PATH; without it the tests skip, saying so.

Stand-ins, because this machine is not the one Megatron runs on: Python 3.12's typing.override,
which megatron/training imports (the environment's Python is 3.11), is the identity; and the two
questions validate_args asks a GPU answer Hopper: get_device_arch_version 9, and
torch.cuda.get_device_capability (9, 0) (asked under --moe-grouped-gemm)."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

MEGATRON_PATH = os.environ.get("LONGSEQ_MEGATRON_PATH", "")

CHILD = r"""
import json, os, sys, typing, warnings
warnings.filterwarnings("ignore")
if not hasattr(typing, "override"):
    typing.override = lambda function: function
from megatron.training import arguments
arguments.get_device_arch_version = lambda: 9
arguments.torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
sys.argv = ["pretrain_gpt.py"] + json.loads(sys.argv[1])
args = arguments.parse_args()
args.world_size = int(os.environ["WORLD_SIZE"])
args.rank = 0
arguments.validate_args(args, {})
keys = ["tensor_model_parallel_size", "sequence_parallel", "context_parallel_size", "cp_comm_type",
        "hierarchical_context_parallel_sizes", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "data_parallel_size",
        "use_distributed_optimizer", "recompute_granularity", "recompute_method", "recompute_num_layers",
        "accumulate_allreduce_grads_in_fp32", "seq_length", "micro_batch_size", "global_batch_size", "num_layers",
        "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "swiglu",
        "normalization", "rotary_base", "untie_embeddings_and_output_weights", "add_bias_linear", "vocab_size",
        "transformer_impl", "bf16", "cross_entropy_loss_fusion", "qk_layernorm", "num_experts", "moe_router_topk",
        "moe_ffn_hidden_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_grouped_gemm",
        "moe_token_dispatcher_type", "moe_permute_fusion", "moe_router_load_balancing_type", "moe_aux_loss_coeff",
        "moe_router_pre_softmax", "window_size", "window_attn_skip_freq", "softmax_type", "quick_geglu", "glu_linear_offset",
        "activation_func_clamp_value", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate", "cpu_offloading",
        "cpu_offloading_num_layers", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
        "v_head_dim", "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_num_groups", "moe_router_group_topk",
        "moe_router_topk_scaling_factor", "moe_router_dtype", "moe_layer_freq", "recompute_modules", "fp8", "fp8_recipe",
        "fp8_param_gather"]
print("MEGATRON_ARGS " + json.dumps({key: getattr(args, key, None) for key in keys}))
"""


def megatron_reads(script_path, world_size):
    """Megatron-LM's parse_args and validate_args over the script's pretrain_gpt.py arguments, with
    the environment it exports."""
    text = script_path.read_text()
    environment = dict(os.environ, WORLD_SIZE=str(world_size), PYTHONPATH=MEGATRON_PATH)
    for name, value in re.findall(r"^export (\w+)=(\S+)$", text, re.M):
        environment[name] = value
    launch = shlex.split(text[text.index("\ntorchrun "):].replace("\\\n", " ").strip().split("\n", 1)[0])
    command = launch[launch.index("pretrain_gpt.py") + 1:]
    assert command[-1] == "$@"  # the user's own arguments (data, tokenizer, schedule) follow
    run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(command[:-1])], capture_output=True, text=True, env=environment,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("MEGATRON_ARGS "))
    return json.loads(line[len("MEGATRON_ARGS "):])


# (plan flags, GPUs, what Megatron must derive): TP x p2p ring over two nodes with recompute; TP x
# a2a x p2p (USP's layout); TP alone with data parallelism and no distributed optimizer; TP x PP x
# p2p; a2a alone.
PLANS = [
    (["--model", "llama-3.1-8b", "--gpus", "16", "--tp", "4", "--ring", "4", "--seqlen", "128Ki"], 16,
     {"tensor_model_parallel_size": 4, "sequence_parallel": True, "context_parallel_size": 4, "cp_comm_type": ["p2p"],
      "data_parallel_size": 1, "use_distributed_optimizer": True}),
    (["--model", "llama-3-8b", "--gpu", "a800-80gb", "--gpus", "16", "--tp", "4", "--sp", "2", "--ring", "2", "--no-checkpointing",
      "--seqlen", "64Ki"], 16,
     {"tensor_model_parallel_size": 4, "context_parallel_size": 4, "cp_comm_type": ["a2a+p2p"], "hierarchical_context_parallel_sizes": [2, 2],
      "data_parallel_size": 1, "recompute_granularity": None}),
    (["--model", "llama-3.1-8b", "--gpus", "16", "--tp", "8", "--zero", "0", "--seqlen", "32Ki"], 16,
     {"tensor_model_parallel_size": 8, "context_parallel_size": 1, "data_parallel_size": 2, "use_distributed_optimizer": False,
      "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}),
    # Pipeline stages with a global batch of 8 micro-batches (1F1B).
    (["--model", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--ring", "2", "--seqlen", "128Ki", "--global-batch", "8"], 64,
     {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 4, "context_parallel_size": 2, "data_parallel_size": 1,
      "global_batch_size": 8}),
    # Block recompute: the first 12 of each stage's 20 layers recomputed, the other 8 keeping theirs.
    (["--model", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--ring", "2", "--recompute-block-layers", "12", "--seqlen",
      "32Ki", "--global-batch", "8"], 64,
     {"pipeline_model_parallel_size": 4, "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 12}),
    # Interleaved: two virtual stages a rank, 8 micro-batches in groups of pp = 4.
    (["--model", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "2", "--ring", "2", "--seqlen", "128Ki", "--global-batch",
      "8"], 64, {"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2, "data_parallel_size": 1}),
    # Transformer Engine's FP8 (hybrid format, the delayed recipe), attention and the output layer in bf16.
    (["--model", "llama-3.1-8b", "--gpus", "16", "--tp", "2", "--ring", "8", "--fp8", "--seqlen", "128Ki"], 16,
     {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_param_gather": False,
      "tensor_model_parallel_size": 2, "context_parallel_size": 8}),
    # Selective recompute of a dense layer's MLP.
    (["--model", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--ring", "4", "--no-checkpointing", "--recompute-modules", "mlp", "--seqlen",
      "128Ki"], 8, {"recompute_granularity": "selective", "recompute_modules": ["mlp"]}),
    # cp_comm_type all_gather (Llama 3's context parallelism: K/V gathered whole).
    (["--model", "llama-3.1-8b", "--gpus", "16", "--tp", "2", "--ring", "8", "--cp-all-gather", "--seqlen", "128Ki"], 16,
     {"cp_comm_type": ["all_gather"], "context_parallel_size": 8}),
    # Uneven stages: Llama 3.1 405B's 126 layers on 16 stages (7, 8 x 14, 7).
    (["--model", "llama-3.1-405b", "--gpus", "512", "--tp", "8", "--pp", "16", "--ring", "4", "--seqlen", "128Ki", "--global-batch", "16"],
     512, {"pipeline_model_parallel_size": 16, "decoder_first_pipeline_num_layers": 7, "decoder_last_pipeline_num_layers": 7,
           "data_parallel_size": 1}),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--tp", "1", "--sp", "4", "--seqlen", "64Ki"], 8,
     {"tensor_model_parallel_size": 1, "context_parallel_size": 4, "cp_comm_type": ["a2a"], "data_parallel_size": 2}),
    # Qwen3-30B-A3B's experts over 8 ranks with TP 4 and a p2p ring (the search's plan on 8 H100s),
    # and over 16 ranks across two nodes with TP 2 and data parallelism: Megatron's MoE layer with
    # the all-to-all dispatcher and grouped experts, q/k norms.
    (["--model", "qwen3-30b-a3b", "--gpus", "8", "--tp", "4", "--ep", "8", "--ring", "2", "--seqlen", "48Ki"], 8,
     {"tensor_model_parallel_size": 4, "expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1, "context_parallel_size": 2,
      "data_parallel_size": 1, "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True, "moe_permute_fusion": True,
      "qk_layernorm": True, "moe_router_pre_softmax": False}),
    (["--model", "qwen3-30b-a3b", "--gpus", "16", "--tp", "2", "--ep", "16", "--seqlen", "16Ki"], 16,
     {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 16, "context_parallel_size": 1, "data_parallel_size": 8}),
    # gpt-oss-20b: its sliding window on every other layer, its sinks (TE's learnable softmax), biased
    # linears, 32 experts over 8 ranks, context parallelism by a2a (the only one TE runs sinks with).
    (["--model", "gpt-oss-20b", "--gpus", "16", "--tp", "4", "--ep", "8", "--sp", "2", "--seqlen", "128Ki"], 16,
     {"tensor_model_parallel_size": 4, "expert_model_parallel_size": 8, "context_parallel_size": 2, "cp_comm_type": ["a2a"],
      "window_size": [127, 0], "window_attn_skip_freq": 2, "softmax_type": "learnable", "add_bias_linear": True, "quick_geglu": True,
      "glu_linear_offset": 1.0, "activation_func_clamp_value": 7.0}),
    # TE's activation offloading of 24 of 32 layers' activations, without recompute.
    (["--model", "llama-3.1-8b", "--gpus", "8", "--tp", "8", "--no-checkpointing", "--offload-activations", "24", "--seqlen", "64Ki"], 8,
     {"cpu_offloading": True, "cpu_offloading_num_layers": 24, "recompute_granularity": None}),
    # Qwen1.5-MoE: 60 experts over 4 ranks, a gated shared expert, softmax over every expert before the
    # top-k (norm_topk_prob false).
    (["--model", "qwen1.5-moe-a2.7b", "--gpus", "8", "--tp", "2", "--ep", "4", "--seqlen", "64Ki"], 8,
     {"expert_model_parallel_size": 4, "moe_shared_expert_intermediate_size": 5632, "moe_shared_expert_gate": True,
      "moe_router_pre_softmax": True, "data_parallel_size": 4}),
    # DeepSeek-V3 (the search's plan on 256 H100s): multi-head latent attention, a p2p ring of 32, its
    # 3 dense first layers and 58 MoE ones, the sigmoid router over 8 groups with its expert bias,
    # one expert a rank.
    (["--model", "deepseek-v3", "--gpus", "256", "--tp", "8", "--ep", "256", "--ring", "32", "--seqlen", "1Mi"], 256,
     {"tensor_model_parallel_size": 8, "expert_model_parallel_size": 256, "context_parallel_size": 32, "cp_comm_type": ["p2p"],
      "data_parallel_size": 1, "multi_latent_attention": True, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128,
      "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "qk_layernorm": True, "moe_router_score_function": "sigmoid",
      "moe_router_enable_expert_bias": True, "moe_router_num_groups": 8, "moe_router_group_topk": 4,
      "moe_router_topk_scaling_factor": 2.5, "moe_router_dtype": "fp32", "moe_layer_freq": [0] * 3 + [1] * 58,
      "moe_router_load_balancing_type": "seq_aux_loss", "moe_shared_expert_intermediate_size": 2048}),
    # Selective recompute of the separate norms, the experts' activation and MLA's up-projections.
    (["--model", "deepseek-v3", "--gpus", "256", "--tp", "8", "--ep", "256", "--no-checkpointing", "--recompute-modules",
      "layernorm,moe_act,mla_up_proj", "--seqlen", "8Ki"], 256,
     {"recompute_granularity": "selective", "recompute_modules": ["layernorm", "moe_act", "mla_up_proj"], "data_parallel_size": 32}),
]


@pytest.mark.parametrize("flags,gpus,derived", PLANS)
def test_megatron_lm_parses_and_validates_the_exported_arguments(flags, gpus, derived, longseq_binary, tmp_path):
    if not MEGATRON_PATH:
        pytest.skip("no Megatron-LM parser: LONGSEQ_MEGATRON_PATH unset (scripts/frameworks-check.sh installs megatron-core 0.19.2)")
    script = tmp_path / "pretrain.sh"
    run = subprocess.run([longseq_binary, "plan", "--framework", "megatron-core", "--emit", "megatron-core", "--emit-out", str(script),
                          "--overwrite", *flags], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    plan = json.loads(subprocess.run([longseq_binary, "plan", "--framework", "megatron-core", "--json", *flags], capture_output=True,
                                     text=True, check=True).stdout)
    args = megatron_reads(script, gpus)
    for key, value in derived.items():
        assert args[key] == value, (key, args[key], value)
    # The model and the step as planned, in Megatron's own reading.
    assert args["seq_length"] == plan["seqlen"]
    assert args["micro_batch_size"] == plan["plan"]["micro_batch"]
    assert args["global_batch_size"] == plan["plan"]["global_batch"]
    assert args["tensor_model_parallel_size"] == plan["plan"]["tp"]
    assert args["pipeline_model_parallel_size"] == plan["plan"]["pp"]
    assert args["context_parallel_size"] == plan["plan"]["sp"] * plan["plan"]["ring"]
    assert args["data_parallel_size"] == plan["plan"]["dp"]
    assert args["use_distributed_optimizer"] == (plan["plan"]["zero_stage"] == 1)
    assert (args["recompute_granularity"] == "full") == plan["plan"]["activation_checkpointing"]
    assert (args["recompute_granularity"] == "selective") == bool(plan["plan"]["recompute_modules"])
    assert args["accumulate_allreduce_grads_in_fp32"] is True  # the fp32 gradient buffer the plan prices
    assert args["cross_entropy_loss_fusion"] is False  # the native loss the plan prices
    assert args["transformer_impl"] == "transformer_engine" and args["bf16"] is True
    assert (args["fp8"] == "hybrid") == plan["plan"]["fp8"] and (args["fp8"] is None) == (not plan["plan"]["fp8"])
    cards = json.loads(subprocess.run([longseq_binary, "models", "--json"], capture_output=True, text=True, check=True).stdout)["models"]
    model = next(card for card in cards if card["card"] == flags[flags.index("--model") + 1])
    assert (args["num_layers"], args["hidden_size"], args["ffn_hidden_size"], args["num_attention_heads"]) == (
        model["layers"], model["hidden_size"], model["intermediate_size"], model["q_heads"])
    mla = model.get("latent_attention")
    if mla:  # q and k heads of qk_head_dim + qk_pos_emb_head_dim, v heads of v_head_dim
        assert args["multi_latent_attention"] is True
        assert (args["qk_head_dim"] + args["qk_pos_emb_head_dim"], args["qk_pos_emb_head_dim"], args["kv_lora_rank"], args["v_head_dim"]) == (
            model["head_dim"], mla["qk_rope_head_dim"], mla["kv_lora_rank"], mla["v_head_dim"])
        assert args["q_lora_rank"] == (mla["q_lora_rank"] or None)
    else:
        assert not args["multi_latent_attention"] and args["kv_channels"] == model["head_dim"]
    if model["kv_heads"] != model["q_heads"]:
        assert args["num_query_groups"] == model["kv_heads"]
    assert (args["swiglu"] or args["quick_geglu"]) == (model["mlp"] == "swiglu")
    assert args["untie_embeddings_and_output_weights"] == (not model["tied_embeddings"])
    assert args["vocab_size"] == model["vocab_size"]
    # A mixture of experts as planned: its experts, their width and the k a token takes, split over the
    # planned expert ranks whole; no experts for a dense model.
    if model.get("moe"):
        moe = model["moe"]
        assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"]) == (
            moe["experts"], moe["experts_per_token"], moe["expert_intermediate_size"])
        assert args["expert_model_parallel_size"] == plan["plan"]["ep"]
        assert args["moe_router_load_balancing_type"] == ("seq_aux_loss" if moe["router"] == "sigmoid" else "aux_loss")
        assert args["moe_aux_loss_coeff"] == 1e-3
        assert args["moe_router_score_function"] == moe["router"]
        if moe["dense_layers"]:
            assert args["moe_layer_freq"] == [0] * moe["dense_layers"] + [1] * (model["layers"] - moe["dense_layers"])
    else:
        assert args["num_experts"] is None and args["expert_model_parallel_size"] == 1
