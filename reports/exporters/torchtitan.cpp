// torchtitan.cpp: --emit torchtitan, torchtitan 0.2.2's TOML job (Reference §11 F6).
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

// dp_replicate), PyTorch context parallelism with the plan's rotation, full activation
// checkpointing, its default precision (fp32 shards, bf16 gather, fp32 reduce).
ExportedConfig torchtitan_job_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const TorchtitanFlavor flavor = torchtitan_flavor(r.model);
  // parallelize_llama asserts seq_len % (tp * 2 * cp) == 0 whatever cp is (tp = 1 here; Reference
  // §11, added 2026-11-26): a length off that grid is written rounded down, which fits as well.
  const int64_t seq_len_multiple = 2 * p.ring;
  const int64_t seq_len = r.seqlen / seq_len_multiple * seq_len_multiple;
  if (seq_len != r.seqlen)
    exported.notes.push_back(fmt::format("seq_len {} is {} rounded down to a multiple of 2 x cp = {} (parallelize_llama asserts seq_len "
                                         "% (tp x 2 x cp) == 0)", seq_len, r.seqlen, seq_len_multiple));
  if (p.sp > 1) exported.notes.push_back("Ulysses: not expressed (torchtitan's sequence parallelism is context parallelism)");
  // torchtitan 0.2.2 has YaRN in its DeepSeek-V3 and gpt-oss model args only (models/*/model/args.py).
  if (const RopeExtension rope = rope_extension(r); rope.factor > 0)
    exported.notes.push_back(rope_extension_note(r, rope, "not expressed: torchtitan's llama3 and qwen3 flavors have no YaRN (0.2.2: only "
                                                          "DeepSeek-V3 and gpt-oss do); the Hugging Face stacks take"));
  if (p.zero_stage != 3) exported.notes.push_back(fmt::format("ZeRO-{}: not expressed (torchtitan shards fully with FSDP2)", p.zero_stage));
  if (p.tiled_mlp || p.tiled_loss || p.fpdt || p.checkpoint_offload)
    exported.notes.push_back("tiled MLP / tiled loss / FPDT / checkpoint offload: not in torchtitan's job config; not expressed");
  if (flavor.flavor.empty())
    exported.notes.push_back(fmt::format("model: {} is none of torchtitan's flavors (llama3 8B, 70B, 405B; qwen3 8B, 14B, 32B, 30B-A3B); "
                                         "[model] name and flavor must name one", r.model.name));
  sdpa_backend_note(r, exported);
  exported.notes.push_back(fmt::format("launch: torchrun --nproc_per_node {} -m torchtitan.train --job.config_file {}{}", r.cluster.gpus_per_node,
                                       main_file(r, "torchtitan.toml"),
                                       r.cluster.nodes > 1 ? fmt::format(" on each of the {} nodes (--nnodes {} and a rendezvous endpoint)",
                                                                         r.cluster.nodes, r.cluster.nodes)
                                                           : ""));
  // torchtitan main replaced TOML job files by Python config registries after v0.2.2 (9810191bbb;
  // its --job.config_file raises "--module is required"): this file is v0.2.2's.
  exported.notes.push_back("versions: torchtitan 0.2.2 exactly (the last release that reads a TOML job; main reads Python config "
                           "registries and refuses --job.config_file), PyTorch >= 2.6 (context parallelism)");
  exported.notes.push_back("[model] hf_assets_path is a placeholder: the tokenizer's folder");
  // Its dataloader takes registered names only (c4, c4_test, c4_validation: datasets/hf_datasets.py).
  exported.notes.push_back("[training] dataset is c4, torchtitan's registered default (streamed from the Hugging Face hub); for your "
                           "data, add an entry to DATASETS in torchtitan/datasets/hf_datasets.py and name it here");
  const std::vector<std::string> header = header_lines(r, "torchtitan (torchrun -m torchtitan.train --job.config_file)", exported.notes);
  std::string text = hash_comments(header);
  text += "\n[job]\ndump_folder = \"./outputs\"\n";
  text += "description = " + toml_basic_string(fmt::format("longseq plan: {} at {} tokens", r.model.name, r.seqlen)) + "\n";
  text += fmt::format("\n[model]\nname = \"{}\"\nflavor = \"{}\"\nhf_assets_path = \"REPLACE-WITH-THE-TOKENIZER-FOLDER\"\n",
                      flavor.flavor.empty() ? "REPLACE-WITH-A-MODEL" : flavor.model_name, flavor.flavor.empty() ? "REPLACE-WITH-A-FLAVOR" : flavor.flavor);
  text += "\n[optimizer]\nname = \"AdamW\"\nlr = 8e-4\n";
  // fp32 shards, bf16 gathers, fp32 reduce-scatters: torchtitan's defaults, written out (F6.4);
  // enable_cpu_offload is CPUOffloadPolicy.
  // global_batch_size = local x the data-parallel degree x accumulation steps (train.py; its
  // default -1 is one local batch per rank: no accumulation).
  text += fmt::format("\n[training]\nlocal_batch_size = {}\n{}seq_len = {}\nsteps = 1000\ndataset = \"c4\"\n"
                      "mixed_precision_param = \"bfloat16\"\nmixed_precision_reduce = \"float32\"\nenable_cpu_offload = {}\n",
                      p.micro_batch, accumulation_steps(r) > 1 ? fmt::format("global_batch_size = {}\n", global_batch(r)) : "", seq_len, p.offload_params && p.offload_optimizer ? "true" : "false");
  // FSDP shards over dp_shard x cp (F6.2); -1 takes the ranks the other degrees leave.
  text += fmt::format("\n[parallelism]\ndata_parallel_replicate_degree = {}\ndata_parallel_shard_degree = -1\n"
                      "fsdp_reshard_after_forward = \"default\"\ntensor_parallel_degree = 1\ncontext_parallel_degree = {}\n"
                      "context_parallel_rotate_method = \"{}\"\n",
                      p.dp_replicate, p.ring, p.cp_all_to_all ? "alltoall" : "allgather");
  // One layer in every N: torchtitan's layer-selective AC (activation_checkpoint.py _apply_layer_sac);
  // every layer under its op policy: _apply_op_sac.
  if (p.activation_checkpointing && p.checkpoint_ops)
    text += "\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n";
  else if (p.activation_checkpointing && p.checkpoint_every > 1)
    text += fmt::format("\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"{}\"\n", p.checkpoint_every);
  else
    text += fmt::format("\n[activation_checkpoint]\nmode = \"{}\"\n", p.activation_checkpointing ? "full" : "none");
  exported.files.push_back({"", text});
  return exported;
}

}  // namespace longseq
