// arctic_training.cpp: --emit arctic-training, ArcticTraining's recipe YAML (FRAMEWORKS §1).
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

ExportedConfig arctic_training_recipe_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const std::string attn_implementation = hf_attn_implementation(r, exported);
  if (p.fpdt) exported.notes.push_back("FPDT: ArcticTraining has no FPDT (it exists only in Megatron-DeepSpeed); this recipe runs without it");
  if (p.zero_stage >= 1 && !p.activation_checkpointing)
    exported.notes.push_back("checkpointing off: model.disable_activation_checkpoint is set (ArcticTraining checkpoints by default)");
  const RopeExtension rope = rope_extension(r);
  exported.notes.push_back(std::string("versions: ArcticTraining >= ") + (rope.factor > 0 ? "0.8.0 (model.hf_config_kwargs, read by 0.8.0's config)" : "0.7.1") +
                           " (key names of main: fused_adam, eval_interval), DeepSpeed >= 0.18.2, liger-kernel >= 0.6.1 with model.type liger");
  if (rope.factor > 0)
    exported.notes.push_back(fmt::format("RoPE past the trained positions: {} tokens against the model's {}; model.hf_config_kwargs sets YaRN "
                                         "(factor {}), which ArcticTraining applies to the model's AutoConfig", integer_with_commas(r.seqlen),
                                         integer_with_commas(rope.original_window), rope.factor));
  if (attn_implementation == "flash_attention_3")
    // AT's model config imports flash_attn (FlashAttention-2's package) for flash_attention_3 too
    // (AT-main config/model.py L85-98), while FlashAttention-3's build installs flash_attn_interface.
    exported.notes.push_back("attention: ArcticTraining's validation imports the flash_attn package for flash_attention_3 too: install "
                             "FlashAttention-2 (flash-attn) beside FlashAttention-3's Hopper build, or the recipe fails validation");
  exported.notes.push_back(fmt::format("launch: arctic_training {} --num_gpus {}{}", main_file(r, "recipe.yml"),
                                       r.cluster.gpus_per_node < r.cluster.gpus ? r.cluster.gpus_per_node : r.cluster.gpus,
                                       r.cluster.nodes > 1 ? fmt::format(" --hostfile hostfile --num_nodes {} --master_addr MAIN_NODE --master_port 29500", r.cluster.nodes) : ""));
  if (r.seqlen % 256 != 0)
    exported.notes.push_back(fmt::format("max_length {} is not a multiple of data.div_length 256: the collator pads every batch to {} "
                                         "tokens, longer than planned", r.seqlen, (r.seqlen + 255) / 256 * 256));
  exported.notes.push_back("data.sources is a placeholder: put your dataset there");
  card_name_note(r, "model.name_or_path", exported);
  YAML::Emitter out;
  yaml_document_begin(out, r, "ArcticTraining (arctic_training recipe.yml)", exported.notes);
  // Only TrainerConfig keys: ArcticTraining forbids any other (pydantic extra="forbid", §1.2).
  out << YAML::Key << "type" << YAML::Value << "sft";
  out << YAML::Key << "micro_batch_size" << YAML::Value << p.micro_batch;
  out << YAML::Key << "gradient_accumulation_steps" << YAML::Value << accumulation_steps(r);
  out << YAML::Key << "sequence_parallel_size" << YAML::Value << p.sp;
  out << YAML::Key << "activation_checkpoint_cpu_offload" << YAML::Value << p.checkpoint_offload;
  out << YAML::Key << "tiled_mlp_compute" << YAML::Value << p.tiled_mlp;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  // Liger's fused linear cross entropy is the tiled loss (with sp > 1 ArcticTraining tiles anyway).
  out << YAML::Key << "type" << YAML::Value << (p.tiled_loss ? "liger" : "huggingface");
  out << YAML::Key << "name_or_path" << YAML::Value;
  out << yaml_input_text(out, model_name_or_path(r));
  out << YAML::Key << "attn_implementation" << YAML::Value << attn_implementation;
  out << YAML::Key << "dtype" << YAML::Value << "bf16";
  out << YAML::Key << "disable_activation_checkpoint" << YAML::Value << !p.activation_checkpointing;
  if (rope.factor > 0) {  // AT's hf_factory sets each key on the AutoConfig before building the model
    out << YAML::Key << "hf_config_kwargs" << YAML::Value << YAML::BeginMap << YAML::Key << "rope_scaling" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "rope_type" << YAML::Value << "yarn";
    out << YAML::Key << "factor" << YAML::Value << fmt::format("{}.0", rope.factor);  // a float, as transformers validates it
    out << YAML::Key << "original_max_position_embeddings" << YAML::Value << rope.original_window;
    out << YAML::Key << "rope_theta" << YAML::Value << fmt::format("{:.1f}", rope.rope_theta);
    out << YAML::EndMap << YAML::EndMap;
  }
  out << YAML::EndMap;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "sources" << YAML::Value << YAML::BeginSeq << "REPLACE-WITH-YOUR-DATASET" << YAML::EndSeq;
  // Always emitted: unset, AT-main takes the model's max_position_embeddings (§1.5).
  out << YAML::Key << "max_length" << YAML::Value << r.seqlen;
  out << YAML::Key << "pack_samples" << YAML::Value << true;
  out << YAML::EndMap;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  // With offload_optimizer the client optimizer must be DeepSpeed's CPU Adam (§1.6, §4.3).
  out << YAML::Key << "type" << YAML::Value << (p.offload_optimizer ? "cpu_adam" : "fused_adam");
  out << YAML::Key << "learning_rate" << YAML::Value << "1e-5";  // a "human" number (AT config/utils.py)
  out << YAML::EndMap;
  out << YAML::Key << "deepspeed" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "zero_optimization" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "stage" << YAML::Value << p.zero_stage;
  // pin_memory as the plan assumed it, whatever the installed DeepSpeed's default (false until
  // v0.19.4, true from v0.19.5: FRAMEWORKS §4.2).
  if (p.zero_stage >= 1) {
    out << YAML::Key << "offload_optimizer" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "device" << YAML::Value
        << (p.offload_optimizer ? "cpu" : "none");
    if (p.offload_optimizer) out << YAML::Key << "pin_memory" << YAML::Value << false;
    out << YAML::EndMap;
  }
  if (p.zero_stage == 3) {
    out << YAML::Key << "offload_param" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "device" << YAML::Value
        << (p.offload_params ? "cpu" : "none");
    if (p.offload_params) out << YAML::Key << "pin_memory" << YAML::Value << false;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  if (p.sp > 1) out << YAML::Key << "seq_parallel_communication_data_type" << YAML::Value << "bf16";
  out << YAML::Key << "gradient_clipping" << YAML::Value << 1.0;
  out << YAML::EndMap;
  out << YAML::EndMap;
  exported.files.push_back({"", std::string(out.c_str()) + "\n"});
  return exported;
}

}  // namespace longseq
