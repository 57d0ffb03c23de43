// megatron_deepspeed.cpp: --emit megatron-deepspeed, pretrain_gpt.py's launch script and its
// DeepSpeed JSON (FRAMEWORKS §3).
#include "reports/exporters/common.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "io/text_escape.hpp"
#include "models/adapters.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "io/config_error.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

using namespace exporters;

ExportedConfig megatron_deepspeed_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  const ModelSpec& m = r.model;
  ExportedConfig exported;
  if (p.tiled_mlp || p.tiled_loss)
    exported.notes.push_back("tiled MLP / tiled loss: Megatron-DeepSpeed chunks the FFN and the loss only inside FPDT; not expressed");
  if (p.fpdt && !(m.mlp_kind == MlpKind::mlp_kind_gelu && m.mlp_bias && m.qkv_bias))
    exported.notes.push_back("FPDT: Megatron-DeepSpeed's FPDT layer needs a GPT-shaped model (GeLU MLP with bias, biased q/k/v); " + m.name +
                             " is not, so these arguments fail as written");
  if (p.fpdt && p.fpdt_chunk_tokens % (32 * p.sp) != 0)
    exported.notes.push_back(fmt::format("FPDT chunk {} is not a multiple of 32 x sp = {} (FPDT's loss chunks need it)", p.fpdt_chunk_tokens,
                                         32 * p.sp));
  exported.notes.push_back(p.fpdt ? "versions: Megatron-DeepSpeed main with FPDT (676a482c or later); DeepSpeed >= 0.19.1 with flash-attn "
                                    "2.7 (DeepSpeed 0.16.1-0.19.0 call flash-attn <= 2.6.3 only, FRAMEWORKS §3.2)"
                                  : "versions: Megatron-DeepSpeed main (676a482c or later), DeepSpeed >= 0.10.2, flash-attn 2.x");
  if (const RopeExtension rope = rope_extension(r); rope.factor > 0)
    exported.notes.push_back(fmt::format("RoPE past the trained positions: {} tokens against the model's {}; not expressed: Megatron-DeepSpeed's "
                                         "rotary embedding has no YaRN (the Hugging Face stacks take {})", integer_with_commas(r.seqlen),
                                         integer_with_commas(rope.original_window), rope_scaling_keyword(rope)));
  if (!m.rope_scaling.empty())
    exported.notes.push_back(fmt::format("RoPE scaling '{}' of {} is not expressed: Megatron-DeepSpeed's rotary embedding has no such "
                                         "scaling, so positions train with the plain base", m.rope_scaling, m.name));
  if (m.rope_theta != std::floor(m.rope_theta))
    exported.notes.push_back(fmt::format("RoPE base {} is not a whole number; --rotary-position-embeddings-theta takes an int", m.rope_theta));
  exported.notes.push_back("data, tokenizer and schedule arguments (--data-path, --tokenizer-type/--tokenizer-model, --train-iters, --lr) are yours");
  if (r.cluster.nodes > 1)
    exported.notes.push_back(fmt::format("{} nodes: write `hostfile` with one `HOSTNAME slots={}` line per node and run the script on the "
                                         "first node (DeepSpeed's launcher starts the others); the DeepSpeed JSON is named by absolute "
                                         "path, so every node must see it at the same path", r.cluster.nodes, r.cluster.gpus_per_node));
  const bool swiglu = m.mlp_kind == MlpKind::mlp_kind_swiglu;
  std::vector<std::string> args = {
      fmt::format("--num-layers {}", m.num_layers), fmt::format("--hidden-size {}", m.hidden_size),
      fmt::format("--ffn-hidden-size {}", m.intermediate_size),  // always: the default is not the model's (§3.5)
      fmt::format("--num-attention-heads {}", m.num_q_heads), fmt::format("--num-key-value-heads {}", m.num_kv_heads),
      fmt::format("--kv-channels {}", m.head_dim), fmt::format("--seq-length {}", r.seqlen),
      fmt::format("--max-position-embeddings {}", r.seqlen)};
  if (swiglu) args.push_back("--swiglu");
  args.push_back(m.norm_kind == NormKind::norm_kind_rmsnorm ? "--normalization rmsnorm" : "--normalization layernorm");
  // The base always: Megatron's default is 10000, not Llama 3's 500000 or Qwen3's 1000000 (§3.5).
  args.push_back(fmt::format("--use-rotary-position-embeddings --rotary-position-embeddings-theta {:.0f}", std::floor(m.rope_theta)));
  if (!m.tied_embeddings) args.push_back("--untie-embeddings-and-output-weights");
  if (!m.qkv_bias && !m.mlp_bias) args.push_back("--disable-bias-linear");
  args.push_back("--attention-dropout 0 --hidden-dropout 0");
  args.push_back(fmt::format("--micro-batch-size {} --global-batch-size {}", p.micro_batch, global_batch(r)));
  args.push_back(fmt::format("--ds-sequence-parallel-size {}", p.sp));
  if (p.fpdt)  // the offloading switch keeps the chunks in host memory (default off, REFERENCE §8)
    args.push_back(fmt::format("--ds-sequence-parallel-fpdt --ds-sequence-parallel-fpdt-chunk-size {} --ds-sequence-parallel-fpdt-offloading",
                               p.fpdt_chunk_tokens));
  args.push_back("--use-flash-attn-v2 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --no-pipeline-parallel");
  if (p.activation_checkpointing) {
    args.push_back("--checkpoint-activations --deepspeed-activation-checkpointing");
    if (p.checkpoint_offload) args.push_back("--checkpoint-in-cpu");
  }
  args.push_back(fmt::format("--bf16 --zero-stage {}", p.zero_stage));  // zero.Init only at 3; the JSON sets the engine's stage
  if (p.offload_optimizer) args.push_back("--cpu-optimizer");  // DeepSpeedCPUAdam, required with offload_optimizer (§3.4)
  args.push_back("--deepspeed --deepspeed_config " + shell_quote(r.companion_file_name));
  std::string script = "#!/usr/bin/env bash\n";
  script += hash_comments(header_lines(r, "Megatron-DeepSpeed (pretrain_gpt.py)", exported.notes));
  script += fmt::format("deepspeed{} --num_gpus {} pretrain_gpt.py \\\n",
                        r.cluster.nodes > 1 ? fmt::format(" --hostfile hostfile --num_nodes {}", r.cluster.nodes) : "",
                        std::min(r.cluster.gpus, r.cluster.gpus_per_node));
  for (size_t i = 0; i < args.size(); ++i) script += "  " + args[i] + (i + 1 < args.size() ? " \\\n" : "\n");
  exported.files.push_back({"", script});
  // Megatron fills nothing: the batch keys equal --micro-batch-size and --global-batch-size (§3.4).
  nlohmann::json config = deepspeed_common(r);
  config["train_micro_batch_size_per_gpu"] = p.micro_batch;
  config["train_batch_size"] = global_batch(r);
  config["gradient_clipping"] = 1.0;
  config["longseq_plan"] = json_record(r, "Megatron-DeepSpeed");
  exported.files.push_back({".deepspeed.json", json_text(config) + "\n"});
  return exported;
}

}  // namespace longseq
