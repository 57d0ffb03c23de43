// megatron_core.cpp: --emit megatron-core, Megatron-LM's pretrain_gpt.py launch script on
// Megatron-Core: tensor parallelism with sequence parallelism, context parallelism by its
// cp_comm_type, the distributed optimizer, full recompute. Every argument is held to Megatron-LM's
// own parser and validate_args (megatron/training/arguments.py, shipped in megatron-core 0.19.2's
// wheel) by the frameworks check (tests/frameworks/test_megatron_export.py).
#include "reports/exporters/common.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "io/text_escape.hpp"
#include "planner/pipeline.hpp"
#include "planner/units.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

using namespace exporters;

namespace {

// Megatron-Core's cp_comm_type for the plan's context parallelism (reference-megatron-core M2.2):
// a ring of K/V blocks (p2p), heads over the group (a2a, Ulysses' layout), or both, a2a inside
// (its groups of u consecutive CP ranks) and p2p across them (a2a+p2p with
// hierarchical_context_parallel_sizes [u, r]).
const char* cp_comm_type(const PlanOptions& p) {
  if (p.cp_all_gather) return "all_gather";
  if (p.sp > 1 && p.ring > 1) return "a2a+p2p";
  return p.sp > 1 ? "a2a" : "p2p";
}

}  // namespace

ExportedConfig megatron_core_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  const ModelSpec& m = r.model;
  ExportedConfig exported;
  exported.notes.push_back("versions: Megatron-LM's pretrain_gpt.py with Megatron-Core 0.16 or later and Transformer Engine (the layer "
                           "and context parallelism priced are TE's); arguments checked against megatron-core 0.19.2's arguments.py");
  exported.notes.push_back("data, tokenizer and schedule arguments (--data-path, --tokenizer-type/--tokenizer-model, --train-iters, --lr) "
                           "are yours; --vocab-size is the model's, for --tokenizer-type NullTokenizer");
  // The loss the plan prices is Megatron's native vocabulary-parallel one (M1.4): Megatron-LM
  // refuses TE's fused kernel ("disabled due to stability issues", arguments.py validate_args).
  exported.notes.push_back("loss: Megatron's vocabulary-parallel cross entropy, unfused (its fp32 copy of the logits' shard is in the "
                           "plan); Megatron-LM refuses --cross-entropy-fusion-impl te");
  if (const RopeExtension rope = rope_extension(r); rope.factor > 0)
    exported.notes.push_back(fmt::format("RoPE past the trained positions: {} tokens against the model's {}; not expressed (set "
                                         "--use-rope-scaling or YaRN's arguments for your model yourself)",
                                         integer_with_commas(r.seqlen), integer_with_commas(rope.original_window)));
  if (!m.rope_scaling.empty())
    exported.notes.push_back(fmt::format("RoPE scaling '{}' of {} is not written: set Megatron's matching arguments ({})", m.rope_scaling,
                                         m.name, m.is_latent_attention() ? "MLA takes YaRN by default: --rotary-scaling-factor, --mscale and "
                                                                           "--mscale-all-dim from the model's rope_scaling"
                                                                         : "--use-rope-scaling for Llama 3's"));
  if (m.mtp_layers > 0)
    exported.notes.push_back(fmt::format("multi-token prediction: {} carries {} MTP module(s); the plan trains without them, so "
                                         "--mtp-num-layers is not set", m.name, m.mtp_layers));
  if (m.rope_theta != std::floor(m.rope_theta))
    exported.notes.push_back(fmt::format("RoPE base {} is not a whole number; --rotary-base takes an int", m.rope_theta));
  if (r.cluster.nodes > 1)
    exported.notes.push_back(fmt::format("{} nodes: run the script on every node with NODE_RANK set (0 to {}) and MASTER_ADDR the first "
                                         "node's address", r.cluster.nodes, r.cluster.nodes - 1));
  const bool swiglu = m.mlp_kind == MlpKind::mlp_kind_swiglu;
  std::vector<std::string> args = {
      fmt::format("--num-layers {}", m.num_layers), fmt::format("--hidden-size {}", m.hidden_size),
      fmt::format("--ffn-hidden-size {}", m.intermediate_size), fmt::format("--num-attention-heads {}", m.num_q_heads)};
  if (m.num_kv_heads != m.num_q_heads) args.push_back(fmt::format("--group-query-attention --num-query-groups {}", m.num_kv_heads));
  if (m.is_latent_attention()) {
    // MLA as the plan prices it (megatron_mla.cpp, M9.1): the latents' ranks and the heads' parts,
    // the latents' norms fused into the up-projections (qk_layernorm, as Megatron-Bridge's DeepSeek
    // providers set, deepseek_v3_bridge.py L62-63).
    const ModelSpec::LatentAttention& mla = m.latent_attention;
    args.push_back(fmt::format("--multi-latent-attention{} --kv-lora-rank {} --qk-head-dim {} --qk-pos-emb-head-dim {} --v-head-dim {}",
                               mla.q_lora_rank > 0 ? fmt::format(" --q-lora-rank {}", mla.q_lora_rank) : std::string(), mla.kv_lora_rank,
                               m.head_dim - mla.qk_rope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim));
  } else {
    args.push_back(fmt::format("--kv-channels {}", m.head_dim));
  }
  args.push_back(fmt::format("--seq-length {} --max-position-embeddings {}", r.seqlen, std::max(r.seqlen, m.max_position_embeddings)));
  // gpt-oss's clamped SwiGLU is Megatron's quick-GeGLU (x sigmoid(1.702 x)) with the linear half
  // offset by 1 and both clamped, as Megatron-Bridge sets it (gpt_oss_bridge.py L82-84).
  if (swiglu && m.swiglu_limit > 0)
    args.push_back(fmt::format("--quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value {}", m.swiglu_limit));
  else if (swiglu) args.push_back("--swiglu");
  args.push_back(m.norm_kind == NormKind::norm_kind_rmsnorm ? "--normalization RMSNorm" : "--normalization LayerNorm");
  args.push_back(fmt::format("--position-embedding-type rope --rotary-base {:.0f}", std::floor(m.rope_theta)));
  if (!m.tied_embeddings) args.push_back("--untie-embeddings-and-output-weights");
  if (!m.mlp_bias && !m.o_proj_bias) args.push_back("--disable-bias-linear");
  if (m.qkv_bias && !m.mlp_bias) args.push_back("--add-qkv-bias");
  if (m.qk_norm || m.is_latent_attention()) args.push_back("--qk-layernorm");
  // Sliding windows as Megatron's TE layer takes them (window_size (W - 1, 0): the query and the
  // W - 1 before it, Megatron-Bridge's gpt_oss_bridge.py L87-88), every other layer full where only
  // half are windowed; the sinks as TE's learnable softmax offset.
  if (m.sliding_window > 0)
    args.push_back(2 * m.windowed_layers == m.num_layers
                       ? fmt::format("--window-size {},0 --window-attn-skip-freq 2", m.sliding_window - 1)
                       : fmt::format("--window-size {},0", m.sliding_window - 1));
  if (m.attention_sinks) args.push_back("--softmax-type learnable");
  if (m.is_moe()) {
    // Megatron's MoE layer as the plan prices it (megatron_moe.cpp, reference-megatron-core M6): TE's
    // grouped experts, the all-to-all dispatcher with TE's fused permute, experts whole on each of the
    // ep ranks, the load-balancing loss at the coefficient Megatron-Bridge sets for Qwen3-MoE
    // (qwen3_moe_bridge.py L64-68; Megatron-LM's default is 0). A router that renormalizes the k
    // chosen (norm_topk_prob) is Megatron's default top-k then softmax; one that does not is its
    // pre-softmax (the bridge's moe_router_pre_softmax = not norm_topk_prob).
    args.push_back(fmt::format("--num-experts {} --moe-router-topk {} --moe-ffn-hidden-size {}", m.experts, m.experts_per_token,
                               m.expert_intermediate_size));
    args.push_back(fmt::format("--expert-model-parallel-size {} --expert-tensor-parallel-size 1", p.ep));
    args.push_back("--moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-permute-fusion");
    if (m.moe_router_sigmoid) {
      // DeepSeek-V3's router as Megatron-Bridge maps it (deepseek_v3_bridge.py L66-76): sigmoid scores
      // with the load-balancing expert bias, the group limit, the routed scale, in fp32, and the
      // sequence-wise auxiliary loss at the config's aux_loss_alpha (DeepSeek-V3's 1e-3).
      args.push_back(fmt::format("--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-dtype fp32"
                                 " --moe-router-topk-scaling-factor {}", m.moe_routed_scaling_factor));
      if (m.moe_router_groups > 1)
        args.push_back(fmt::format("--moe-router-num-groups {} --moe-router-group-topk {}", m.moe_router_groups, m.moe_router_group_topk));
      args.push_back("--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-3");
    } else {
      args.push_back("--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3");
      if (!m.moe_normalize_topk) args.push_back("--moe-router-pre-softmax");
    }
    // Dense first layers: Megatron's layer pattern, 0 dense and 1 MoE (a list of integers only).
    if (m.dense_layers > 0)
      args.push_back(fmt::format("--moe-layer-freq '([0]*{}+[1]*{})'", m.dense_layers, m.moe_layers()));
    if (m.shared_expert_intermediate_size > 0)
      args.push_back(fmt::format("--moe-shared-expert-intermediate-size {}{}", m.shared_expert_intermediate_size,
                                 m.shared_expert_gate ? " --moe-shared-expert-gate" : ""));
  }
  args.push_back(fmt::format("--vocab-size {}", m.vocab_size));
  args.push_back("--attention-dropout 0 --hidden-dropout 0");
  args.push_back(fmt::format("--micro-batch-size {} --global-batch-size {}", p.micro_batch, global_batch(r)));
  args.push_back("--transformer-impl transformer_engine --bf16");
  // TE's FP8 as the plan prices it (M10): E4M3 forward, E5M2 gradients, Megatron's default delayed
  // recipe written out (transformer_config.py L566-579), attention and the output layer in bf16 (their
  // FP8 switches, fp8_dot_product_attention and fp8_output_proj, stay off).
  if (p.fp8) args.push_back("--fp8-format hybrid --fp8-recipe delayed");
  args.push_back(fmt::format("--tensor-model-parallel-size {}{}", p.tp, p.tp > 1 ? " --sequence-parallel" : ""));
  if (p.sequence_ranks() > 1) {
    std::string cp = fmt::format("--context-parallel-size {} --cp-comm-type {}", p.sequence_ranks(), cp_comm_type(p));
    if (p.sp > 1 && p.ring > 1) cp += fmt::format(" --hierarchical-context-parallel-sizes {} {}", p.sp, p.ring);
    args.push_back(cp);
  }
  args.push_back(p.vpp > 1 ? fmt::format("--pipeline-model-parallel-size {} --num-virtual-stages-per-pipeline-rank {}", p.pp, p.vpp)
                           : fmt::format("--pipeline-model-parallel-size {}", p.pp));
  // Megatron's uneven split where the stages do not divide the layers (pipeline_split).
  if (const PipelineSplit split = pipeline_split(m, p); p.pp > 1 && !split.even())
    args.push_back(fmt::format("--decoder-first-pipeline-num-layers {} --decoder-last-pipeline-num-layers {}", split.first, split.last));
  if (p.zero_stage >= 1) args.push_back("--use-distributed-optimizer");
  // The gradient buffer in fp32, as the plan prices it (the megatron-core profile, M3.1).
  args.push_back("--accumulate-allreduce-grads-in-fp32");
  // Selective recompute of modules (M5.1); or every layer recomputed (uniform, one layer a chunk), or
  // block recompute's first n of each stage (M5.2).
  if (p.recompute_modules.any())
    args.push_back(fmt::format("--recompute-granularity selective --recompute-modules {}", megatron_recompute_modules_describe(p.recompute_modules, " ")));
  if (p.activation_checkpointing)
    args.push_back(p.recompute_block_layers > 0
                       ? fmt::format("--recompute-granularity full --recompute-method block --recompute-num-layers {}", p.recompute_block_layers)
                       : "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  // TE's activation offloading of the first N layers (cpu_offloading; arguments.py L1869-1870 turns
  // it on from the count).
  if (p.offload_activation_layers > 0) args.push_back(fmt::format("--cpu-offloading-num-layers {}", p.offload_activation_layers));

  std::string script = "#!/usr/bin/env bash\n";
  script += hash_comments(header_lines(r, "Megatron-LM (pretrain_gpt.py on Megatron-Core)", exported.notes));
  script += "set -euo pipefail\n";
  // Tensor and context parallelism need it before Blackwell (validate_args asserts it).
  script += "export CUDA_DEVICE_MAX_CONNECTIONS=1\n";
  const int64_t per_node = std::min(r.cluster.gpus, r.cluster.gpus_per_node);
  script += r.cluster.nodes > 1 ? fmt::format("torchrun --nproc-per-node {} --nnodes {} --node-rank \"${{NODE_RANK:?set NODE_RANK}}\" "
                                              "--master-addr \"${{MASTER_ADDR:?set MASTER_ADDR}}\" --master-port 29500 pretrain_gpt.py \\\n",
                                              per_node, r.cluster.nodes)
                                : fmt::format("torchrun --nproc-per-node {} pretrain_gpt.py \\\n", per_node);
  for (size_t i = 0; i < args.size(); ++i) script += "  " + args[i] + (i + 1 < args.size() ? " \\\n" : " \"$@\"\n");
  exported.files.push_back({"", script});
  return exported;
}

}  // namespace longseq
