// unsloth.cpp: --emit unsloth, an Unsloth script (Reference §12 items 25-40).
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

// An Unsloth script (Reference §12 items 25-40): FastLanguageModel with the planned length, a 4-bit
// base for QLoRA, get_peft_model with the planned adapters and its offloaded checkpointing, TRL's
// SFTTrainer (Unsloth's fused, chunked cross entropy runs by itself).
ExportedConfig unsloth_script_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  if (p.sequence_ranks() > 1 || p.zero_stage > 0 || p.offload_optimizer || p.offload_params || p.fpdt)
    exported.notes.push_back("sequence parallelism, ZeRO, offload of states, FPDT: not expressed (Unsloth trains on one GPU)");
  exported.notes.push_back("the plan priced Unsloth's LoRA layers with PEFT's saved tensors; its fused LoRA kernels save fewer (item 37)");
  if (const RopeExtension rope = rope_extension(r); rope.factor > 0)
    exported.notes.push_back(rope_extension_note(r, rope, "not set here: Unsloth's from_pretrained scales RoPE to max_seq_length itself "
                                                          "(its documentation; not checked here, Unsloth needs a GPU), where transformers takes"));
  // Unsloth pins trl<=0.24.0, which accepts every SFTConfig argument this script passes.
  exported.notes.push_back(std::string("versions: unsloth >= 2025.9 with unsloth_zoo (offloaded checkpointing, fused cross entropy), TRL "
                                       "0.24 (Unsloth pins trl<=0.24.0)") +
                           (p.qlora || p.adam_8bit ? ", bitsandbytes >= 0.45" : ""));
  exported.notes.push_back(fmt::format("launch: python {}", main_file(r, "train_unsloth.py")));
  exported.notes.push_back("the dataset is a placeholder: put yours in load_dataset(...)");
  card_name_note(r, "MODEL", exported);
  const std::vector<std::string> header = header_lines(r, "Unsloth (python script)", exported.notes);
  std::string text = hash_comments(header);
  text += "from unsloth import FastLanguageModel  # first: it patches transformers and TRL\nimport torch\n"
          "from datasets import load_dataset\nfrom trl import SFTConfig, SFTTrainer\n\n";
  text += fmt::format("MODEL = {}\nMAX_SEQ_LENGTH = {}\n\n", python_string_literal(model_name_or_path(r)), r.seqlen);
  std::string load = fmt::format("model_name=MODEL, max_seq_length=MAX_SEQ_LENGTH, dtype=torch.bfloat16, load_in_4bit={}",
                                 p.qlora ? "True" : "False");
  if (!p.lora()) load += ", full_finetuning=True";
  if (p.tiled_mlp) load += ", unsloth_tiled_mlp=True";  // item 34
  text += fmt::format("model, tokenizer = FastLanguageModel.from_pretrained({})\n", load);
  const std::string checkpointing = !p.activation_checkpointing ? "False" : p.checkpoint_offload ? "\"unsloth\"" : "True";
  if (p.lora()) {
    const std::string targets = lora_target_modules(r);
    // Its defaults (item 40) but for the planned rank and targets: dropout 0 and no bias install
    // the fused kernels.
    text += fmt::format("model = FastLanguageModel.get_peft_model(model, r={}, lora_alpha={}, lora_dropout=0, bias=\"none\",\n"
                        "                                      target_modules=[{}], use_gradient_checkpointing={})\n",
                        p.lora_rank, p.lora_rank, targets, checkpointing);
  }
  std::string config = fmt::format("output_dir=\"out\", max_length=MAX_SEQ_LENGTH, per_device_train_batch_size={}, "
                                   "gradient_accumulation_steps={}, bf16=True", p.micro_batch, accumulation_steps(r));
  if (!p.lora()) config += fmt::format(",\n                 gradient_checkpointing={}", p.activation_checkpointing ? "True" : "False");
  if (p.adam_8bit) config += ", optim=\"adamw_8bit\"";
  text += fmt::format("args = SFTConfig({})\n", config);
  text += "trainer = SFTTrainer(model=model, processing_class=tokenizer, args=args,\n"
          "                     train_dataset=load_dataset(\"REPLACE-WITH-YOUR-DATASET\", split=\"train\"))\n";
  text += "trainer.train()\n";
  exported.files.push_back({"", text});
  return exported;
}

}  // namespace longseq
