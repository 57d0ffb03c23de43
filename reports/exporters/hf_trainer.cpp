// hf_trainer.cpp: --emit hf-trainer, a TRL SFTTrainer script for the plain HF Trainer path.
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

namespace exporters {

std::string trl_script_text(const ExportRequest& r, const std::vector<std::string>& header, const std::string& attn_implementation,
                            const std::vector<std::string>& config_arguments) {
  const PlanOptions& p = r.plan;
  std::string text = hash_comments(header);
  text += "import torch\nfrom datasets import load_dataset\nfrom transformers import AutoModelForCausalLM";
  text += p.qlora ? ", BitsAndBytesConfig\n" : "\n";
  const bool transformers_offload = p.activation_checkpointing && p.checkpoint_offload && !p.trl_activation_offload;
  if (transformers_offload)
    // gradient_checkpointing_kwargs={"offload": True} shipped in transformers 5.17; 5.16 accepts the
    // key and offloads nothing, so the planned length would not fit (TRL's 1M example checks too).
    text += "import transformers\nfrom packaging.version import Version\n";
  if (p.lora()) text += "from peft import LoraConfig\n";
  text += "from trl import SFTConfig, SFTTrainer\n\n";
  if (transformers_offload)
    text += "if Version(transformers.__version__) < Version(\"5.17\"):\n"
            "    raise SystemExit(\"the plan offloads checkpoints with gradient_checkpointing_kwargs={'offload': True}, which needs \"\n"
            "                     \"transformers >= 5.17; this is \" + transformers.__version__)\n\n";
  text += fmt::format("MODEL = {}\n\n", python_string_literal(model_name_or_path(r)));
  std::string load_arguments = fmt::format("dtype=torch.bfloat16, attn_implementation=\"{}\"", attn_implementation);
  // Past the trained positions: YaRN over the model's window, as TRL's 1M example loads Qwen3-8B.
  if (const RopeExtension extension = rope_extension(r); extension.factor > 0) load_arguments += ", " + rope_scaling_keyword(extension);
  if (p.qlora) {
    // The QLoRA recipes' settings, not transformers' defaults (fp4, no double quantization, fp32
    // compute; item 16): NF4, double quantization, bf16 compute, as the plan priced. A sharded base
    // (FSDP2 here) keeps its packed values in bf16 storage, the only kind it shards (adapter_notes).
    text += "quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=True,\n"
            "                                  bnb_4bit_compute_dtype=torch.bfloat16";
    text += p.zero_stage == 3 ? ",\n                                  bnb_4bit_quant_storage=torch.bfloat16)\n" : ")\n";
    load_arguments += ", quantization_config=quantization";
  }
  text += fmt::format("model = AutoModelForCausalLM.from_pretrained(MODEL, {})\n", load_arguments);
  if (p.lora()) {
    // Adapters stay fp32 (autocast_adapter_dtype's default, item 8); with a 4-bit base TRL casts
    // them to bf16 (item 13): what the plan priced either way (the runtime profile).
    text += fmt::format("peft_config = LoraConfig(r={}, lora_alpha={}, lora_dropout=0.0, target_modules=[{}], task_type=\"CAUSAL_LM\")\n",
                        p.lora_rank, p.lora_rank, lora_target_modules(r));
  }
  // One argument after another, a line ending before it passes 120 characters.
  const std::string indent(17, ' ');  // under the first argument, after "args = SFTConfig("
  std::string config = "args = SFTConfig(";
  size_t line_start = 0;
  for (size_t i = 0; i < config_arguments.size(); ++i) {
    if (i > 0) {
      const bool wraps = config.size() - line_start + config_arguments[i].size() + 2 > 120;
      config += wraps ? ",\n" + indent : ", ";
      if (wraps) line_start = config.size() - indent.size();
    }
    config += config_arguments[i];
  }
  text += config + ")\n";
  text += fmt::format("trainer = SFTTrainer(model=model, args=args, train_dataset=load_dataset(\"REPLACE-WITH-YOUR-DATASET\", split=\"train\"){})\n",
                      p.lora() ? ", peft_config=peft_config" : "");
  text += "trainer.train()\n";
  return text;
}

}  // namespace exporters

// A TRL SFTTrainer script for the plain HF Trainer path, with PEFT's LoraConfig and bitsandbytes'
// BitsAndBytesConfig when the plan trains adapters (Reference §12 items 5, 8, 13, 15-16; §11 F5.1-F5.7).
ExportedConfig hf_trainer_script_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const std::string attn_implementation = hf_attn_implementation(r, exported);
  if (p.sp > 1 || p.ring > 1) exported.notes.push_back("sequence parallelism: not expressed (the plain Trainer has none; --emit accelerate or accelerate-fsdp2)");
  if (p.zero_stage > 0 || p.offload_optimizer || p.offload_params) exported.notes.push_back("ZeRO and offload: not expressed (--emit accelerate for DeepSpeed)");
  if (p.tiled_mlp || p.fpdt) exported.notes.push_back("tiled MLP / FPDT: not expressed");
  exported.notes.push_back(std::string("versions: transformers >= 4.56.1 (from_pretrained(dtype=...); TRL 0.26 requires 4.56.1), TRL >= 0.26") +
                           (p.lora() ? ", PEFT >= 0.17 (0.18 under transformers 5: 0.17 imports its removed HybridCache)" : "") + (p.qlora || p.adam_8bit ? ", bitsandbytes >= 0.45" : "") +
                           (p.tiled_loss ? ", liger-kernel >= 0.6.1 (use_liger_kernel)" : "") +
                           (p.checkpoint_offload && !p.trl_activation_offload ? "; transformers >= 5.17 for gradient_checkpointing_kwargs offload (the "
                                                                                 "script checks it)" : ""));
  exported.notes.push_back(r.cluster.gpus > 1 ? fmt::format("launch: {} (DDP: a replica a GPU)", torchrun_launch(r, "train.py"))
                                               : fmt::format("launch: python {}", main_file(r, "train.py")));
  exported.notes.push_back("the dataset is a placeholder: put yours in load_dataset(...)");
  card_name_note(r, "MODEL", exported);
  std::vector<std::string> config = {"output_dir=\"out\"", fmt::format("max_length={}", r.seqlen),
                                     fmt::format("per_device_train_batch_size={}", p.micro_batch),
                                     fmt::format("gradient_accumulation_steps={}", accumulation_steps(r)), "bf16=True",
                                     fmt::format("gradient_checkpointing={}", p.activation_checkpointing ? "True" : "False")};
  // Checkpoint offload: TRL's activation offloading when the plan holds it (F5.2), else transformers'.
  if (p.activation_checkpointing && p.checkpoint_offload)
    config.push_back(p.trl_activation_offload ? "activation_offloading=True" : "gradient_checkpointing_kwargs={\"offload\": True}");
  if (p.tiled_loss) config.push_back("use_liger_kernel=True");
  // bitsandbytes' AdamW8bit (Reference §12 item 23), not its paged variant: paged state lives in
  // CUDA managed memory outside the allocator the plan counts (item 24).
  if (p.adam_8bit) config.push_back("optim=\"adamw_8bit\"");
  std::string text = trl_script_text(r, header_lines(r, "the HF Trainer / TRL (python script)", exported.notes), attn_implementation, config);
  exported.files.push_back({"", text});
  return exported;
}

}  // namespace longseq
