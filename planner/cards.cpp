#include "planner/cards.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <stdexcept>
#include <vector>
#include <fmt/format.h>

#include "io/config_error.hpp"
#include "io/embedded_files.hpp"
#include "io/nearest_names.hpp"
#include "models/model_loader.hpp"
#include "io/yaml_reader.hpp"

namespace longseq {

extern const EmbeddedFile builtin_hardware_cards[];
extern const int builtin_hardware_cards_count;
extern const EmbeddedFile builtin_runtime_profiles[];
extern const int builtin_runtime_profiles_count;

namespace {

// A path that exists is read from disk; otherwise the name must be one of the built-in files.
template <typename Parse>
auto load_named(const std::string& name_or_path, std::span<const EmbeddedFile> files, const char* what,
                const char* flag, Parse parse) {
  std::error_code error;
  if (std::filesystem::is_regular_file(name_or_path, error)) return parse(file_read_text(name_or_path), name_or_path);
  if (const EmbeddedFile* file = embedded_file_find(files, name_or_path))
    return parse(file->content, std::string("built-in ") + what + " " + file->file_name);
  // As people write them: any case, and a unique beginning ("H200", "h200" for h200-141gb).
  const std::string lowered = text_to_lower(name_or_path);
  std::vector<std::string> starting;
  std::string known;
  for (const auto& name : embedded_file_stems(files)) {
    known += (known.empty() ? "" : ", ") + name;
    if (name == lowered) starting = {name};
    if (!lowered.empty() && name.rfind(lowered, 0) == 0 && !(starting.size() == 1 && starting.front() == lowered)) starting.push_back(name);
  }
  // "a10" begins a10-24gb and the A100 cards: a beginning that ends at a word ('-') names the one card it ends at.
  if (starting.size() > 1) {
    std::vector<std::string> whole_word;
    for (const std::string& name : starting)
      if (name.size() > lowered.size() && name[lowered.size()] == '-') whole_word.push_back(name);
    if (whole_word.size() == 1) starting = whole_word;
  }
  if (starting.size() == 1) {
    const EmbeddedFile* file = embedded_file_find(files, starting.front());
    return parse(file->content, std::string("built-in ") + what + " " + file->file_name);
  }
  if (starting.size() > 1)
    throw ConfigError(flag, "", fmt::format("'{}' names more than one built-in {}: did you mean {}?", name_or_path, what, names_listed(starting)));
  throw ConfigError(flag, "", fmt::format("unknown {} '{}': not a file, and not built in ({})", what, name_or_path, known));
}

std::span<const EmbeddedFile> hardware_files() {
  return {builtin_hardware_cards, static_cast<size_t>(builtin_hardware_cards_count)};
}
std::span<const EmbeddedFile> profile_files() {
  return {builtin_runtime_profiles, static_cast<size_t>(builtin_runtime_profiles_count)};
}

// A scalar (a figure without spread) or {low, point, high} in the given bounds, low <= point <= high.
EstimateRange estimate_read(YamlReader& reader, const std::string& key, double minimum, double maximum,
                            double default_value) {
  EstimateRange range;
  if (reader.has(key) && reader.is_mapping(key)) {
    YamlReader section = reader.get_section(key);
    range.low = section.get_double("low", minimum, maximum);
    range.point = section.get_double("point", minimum, maximum);
    range.high = section.get_double("high", minimum, maximum);
    section.reject_unknown_keys();
    if (!(range.low <= range.point && range.point <= range.high))
      throw ConfigError(reader.source_name(), reader.key_name(key), "expected low <= point <= high");
    return range;
  }
  range.low = range.point = range.high = reader.get_double(key, minimum, maximum, default_value);
  return range;
}

}  // namespace

const std::vector<AttentionKernelFacts>& attention_kernels_all() {
  static const std::vector<AttentionKernelFacts> kernels = {
      // SDPA's flash backend is this kernel's code (aten flash_api.cpp mha_fwd/mha_bwd, Reference §11
      // F3.1-F3.2), so it runs under SDPA as well as through flash_attn.
      {"fa2", "FlashAttention-2", "flash_attention_2", true, &HardwareCard::flash_attention_tflops_hd128,
       &HardwareCard::flash_attention_tflops_hd64, "flash_attention_tflops", "runs on every card",
       // flash_api.cpp mha_fwd (flash-attn 2.8.3 L393, L435): head_size <= 256, and the kernel runs at
       // round_multiple(head_size, head_size <= 128 ? 32 : 64) (flash_attn_interface.py L460-463 first
       // pads q/k/v to a multiple of 8; aten's copy refuses one that is not, Reference §11 F3.1).
       {32, 64, 96, 128, 192, 256}, "flash-attn 2.8.3 csrc/flash_attn/flash_api.cpp L393, L435"},
      // flash-attention's Hopper build (hopper/, flash_attn_interface); not an SDPA backend.
      {"fa3", "FlashAttention-3", "flash_attention_3", false, &HardwareCard::flash_attention3_tflops_hd128,
       &HardwareCard::flash_attention3_tflops_hd64, "flash_attention3_tflops", "runs on Hopper GPUs only",
       // hopper/generate_kernels.py L32 HEAD_DIMENSIONS; hopper/flash_attn_interface.py L249 slices
       // the gradients of a padded head dim back.
       {64, 96, 128, 192, 256}, "flash-attn 2.8.3 hopper/generate_kernels.py L32"},
      // cuDNN's fused flash attention behind SDPA (aten _scaled_dot_product_cudnn_attention, F2.1).
      {"sdpa-cudnn", "SDPA's cuDNN backend", "sdpa", true, &HardwareCard::sdpa_cudnn_tflops_hd128, &HardwareCard::sdpa_cudnn_tflops_hd64,
       "sdpa_cudnn_tflops", "is priced on Hopper cards only", {}, ""},
  };
  return kernels;
}

int64_t attention_kernel_head_dim(const AttentionKernelFacts& kernel, int64_t head_dim) {
  if (kernel.compiled_head_dims.empty()) return head_dim;
  for (int64_t compiled : kernel.compiled_head_dims)
    if (compiled >= head_dim) return compiled;
  return 0;
}

const AttentionKernelFacts& attention_kernel_facts(std::string_view id) {
  for (const AttentionKernelFacts& kernel : attention_kernels_all())
    if (kernel.id == id) return kernel;
  throw std::invalid_argument(fmt::format("attention kernel '{}': expected {}", id, attention_kernel_choices(false)));
}

std::vector<std::string> attention_kernel_ids(bool with_sdpa) {
  std::vector<std::string> ids;
  for (const AttentionKernelFacts& kernel : attention_kernels_all()) ids.emplace_back(kernel.id);
  if (with_sdpa) ids.emplace_back("sdpa");
  return ids;
}

std::string attention_kernel_choices(bool with_sdpa) {
  const std::vector<std::string> ids = attention_kernel_ids(with_sdpa);
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i == 0 ? "" : i + 1 == ids.size() ? " or " : ", ") + ids[i];
  return text;
}

std::string attention_kernel_resolve(const std::string& requested, const HardwareCard& card) {
  if (requested.empty()) return card.default_attention_kernel;
  if (requested == "sdpa") return card.sdpa_default_backend;
  return requested;
}

bool attention_kernel_known(const std::string& id, bool with_sdpa) {
  const std::vector<std::string> ids = attention_kernel_ids(with_sdpa);
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

RuntimeProfile runtime_profile_bounded(const RuntimeProfile& profile, EstimateBound bound) {
  RuntimeProfile bounded = profile;
  bounded.bound = bound;
  if (bound == EstimateBound::estimate_low_memory) bounded.calibrated_reserve_gib = 0;
  return bounded;
}

HardwareCard hardware_card_from_text(const std::string& yaml_text, const std::string& source_name) {
  YamlReader reader(yaml_text, source_name);
  HardwareCard card;
  card.name = reader.get_string("name");
  if (reader.has("names"))
    for (const auto& [node, name] : reader.get_sequence("names")) card.names.push_back(hardware_name_normalized(reader.node_to_string(node, name)));
  card.gpu_memory_gib = reader.get_double("gpu_memory_gib", 0.001, 1e6);
  card.peak_bf16_tflops = reader.get_double("peak_bf16_tflops", 0.001, 1e7);
  card.peak_fp8_tflops = reader.get_double("peak_fp8_tflops", 0, 1e7, 0);
  card.fp8_transposed_copies = reader.get_bool("fp8_transposed_copies", true);
  card.gpus_per_node = reader.get_int("gpus_per_node", 1, 1024);
  card.host_memory_gib = reader.get_double("host_memory_gib", 0.001, 1e9);
  card.pcie_host_to_device_gbps = reader.get_double("pcie_host_to_device_gbps", 0.001, 1e6);
  card.pcie_device_to_host_gbps = reader.get_double("pcie_device_to_host_gbps", 0.001, 1e6);
  card.nvlink_gbps = reader.get_double("nvlink_gbps", 0.001, 1e6);
  card.internode_gbps_per_node = reader.get_double("internode_gbps_per_node", 0.001, 1e7);
  card.matmul_achieved_tflops = reader.get_double("matmul_achieved_tflops", 0.001, 1e7);
  card.flash_attention_tflops_hd128 = reader.get_double("flash_attention_tflops_hd128", 0.001, 1e7);
  card.flash_attention_tflops_hd64 = reader.get_double("flash_attention_tflops_hd64", 0.001, 1e7);
  card.flash_attention3_tflops_hd128 = reader.get_double("flash_attention3_tflops_hd128", 0, 1e7, 0);
  card.flash_attention3_tflops_hd64 = reader.get_double("flash_attention3_tflops_hd64", 0, 1e7, 0);
  card.sdpa_cudnn_tflops_hd128 = reader.get_double("sdpa_cudnn_tflops_hd128", 0, 1e7, 0);
  card.sdpa_cudnn_tflops_hd64 = reader.get_double("sdpa_cudnn_tflops_hd64", 0, 1e7, 0);
  // A default kernel must have its rate on the card: the time model prices every plan with it.
  const auto check_default = [&](const char* key, const std::string& kernel) {
    if (!attention_kernel_known(kernel, false))
      throw ConfigError(source_name, key, fmt::format("expected {}, got '{}'", attention_kernel_choices(false), kernel));
    if (const AttentionKernelFacts& facts = attention_kernel_facts(kernel); card.*facts.tflops_hd128 <= 0)
      throw ConfigError(source_name, key, fmt::format("{} needs the card's {}_hd128 and _hd64 ({}'s rates)", kernel,
                                                      facts.card_rate_prefix, facts.label));
  };
  card.default_attention_kernel = reader.get_string("default_attention_kernel", "fa2");
  check_default("default_attention_kernel", card.default_attention_kernel);
  card.sdpa_default_backend = reader.get_string("sdpa_default_backend", "fa2");
  check_default("sdpa_default_backend", card.sdpa_default_backend);
  if (!attention_kernel_facts(card.sdpa_default_backend).sdpa_backend)
    throw ConfigError(source_name, "sdpa_default_backend", fmt::format("{} is not one of SDPA's backends", card.sdpa_default_backend));
  card.hbm_gbps = reader.get_double("hbm_gbps", 0.001, 1e7);
  card.nccl_intranode_busbw_gbps = reader.get_double("nccl_intranode_busbw_gbps", 0.001, 1e6);
  card.nccl_latency_us = reader.get_double("nccl_latency_us", 0, 1e6);
  card.host_memory_gbps = reader.get_double("host_memory_gbps", 0.001, 1e6);
  card.approximate_rates = reader.get_string("approximate_rates", "");
  reader.reject_unknown_keys();
  return card;
}

RuntimeProfile runtime_profile_from_text(const std::string& yaml_text, const std::string& source_name) {
  YamlReader reader(yaml_text, source_name);
  RuntimeProfile profile;
  profile.name = reader.get_string("name");
  profile.activation_bytes = reader.get_int("activation_bytes", 1, 8);
  profile.weight_bytes = reader.get_int("weight_bytes", 1, 8);
  profile.gradient_bytes = reader.get_int("gradient_bytes", 0, 8);
  profile.master_weight_bytes = reader.get_int("master_weight_bytes", 0, 8);
  profile.optimizer_state_bytes = reader.get_int("optimizer_state_bytes", 0, 16);
  profile.working_gradient_bytes = reader.get_int("working_gradient_bytes", 1, 8);
  profile.cuda_context_gib = reader.get_double("cuda_context_gib", 0, 1024);
  profile.nccl_buffers_gib = estimate_read(reader, "nccl_buffers_gib", 0, 1024, 0);
  profile.nccl_sequence_parallel_communicators = reader.get_int("nccl_sequence_parallel_communicators", 0, 8, 0);
  profile.allocator_fragmentation_gib = estimate_read(reader, "allocator_fragmentation_gib", 0, 1024, 0);
  profile.cublas_workspace_mib = reader.get_double("cublas_workspace_mib", 0, 1 << 20);
  profile.ddp_gradient_bucket_copy = reader.get_bool("ddp_gradient_bucket_copy", false);
  profile.gradients_freed_after_step = reader.get_bool("gradients_freed_after_step", false);
  profile.checkpointing_non_reentrant = reader.get_bool("checkpointing_non_reentrant", false);
  const std::string sharding = reader.get_string("parameter_sharding", "deepspeed_zero");
  if (sharding == "deepspeed_zero") profile.parameter_sharding = ParameterSharding::sharding_deepspeed_zero;
  else if (sharding == "fsdp2") profile.parameter_sharding = ParameterSharding::sharding_fsdp2;
  else throw ConfigError(source_name, "parameter_sharding", fmt::format("expected deepspeed_zero or fsdp2, got '{}'", sharding));
  profile.gathered_weight_bytes = reader.get_int("gathered_weight_bytes", 0, 8, 0);
  profile.reduce_bytes = reader.get_int("reduce_bytes", 0, 8, 0);
  const std::string ring = reader.get_string("ring_implementation", "usp_ring");
  if (ring == "usp_ring") profile.ring_implementation = RingImplementation::ring_usp;
  else if (ring == "torch_allgather") profile.ring_implementation = RingImplementation::ring_torch_allgather;
  else throw ConfigError(source_name, "ring_implementation", fmt::format("expected usp_ring or torch_allgather, got '{}'", ring));
  profile.loss_chunk_tokens = reader.get_int("loss_chunk_tokens", 0, int64_t{1} << 30, 0);
  profile.zero_reduce_bucket_elements = reader.get_int("zero_reduce_bucket_elements", 0, int64_t{1} << 40);
  profile.zero_prefetch_bucket_elements = reader.get_int("zero_prefetch_bucket_elements", 0, int64_t{1} << 40);
  profile.ulysses_staging_copies = reader.get_int("ulysses_staging_copies", 0, 8);
  profile.flash_attention_dq_accumulator = reader.get_bool("flash_attention_dq_accumulator");
  profile.flash_attention_expands_gqa_grads = reader.get_bool("flash_attention_expands_gqa_grads");
  profile.fused_swiglu = reader.get_bool("fused_swiglu");
  const std::string liger = reader.get_string("liger_kernels", "never");
  if (liger == "never") profile.liger_kernels = LigerKernels::liger_never;
  else if (liger == "always") profile.liger_kernels = LigerKernels::liger_always;
  else if (liger == "with_tiled_loss") profile.liger_kernels = LigerKernels::liger_with_tiled_loss;
  else throw ConfigError(source_name, "liger_kernels", fmt::format("expected never, always or with_tiled_loss, got '{}'", liger));
  profile.eager_rms_norm_without_liger = reader.get_bool("eager_rms_norm_without_liger", false);
  profile.flash_attention_varlen_pad_rows = reader.get_int("flash_attention_varlen_pad_rows", 0, 1 << 20, 0);
  profile.zero3_tiled_mlp_holds_weight_grads = reader.get_bool("zero3_tiled_mlp_holds_weight_grads", false);
  profile.zero3_max_live_parameters = reader.get_int("zero3_max_live_parameters", 0, int64_t{1} << 50, 0);
  const std::string tiling = reader.get_string("loss_tiling");
  if (tiling == "liger") profile.loss_tiling = LossTiling::loss_tiling_liger;
  else if (tiling == "shards") profile.loss_tiling = LossTiling::loss_tiling_shards;
  else if (tiling == "unsloth") profile.loss_tiling = LossTiling::loss_tiling_unsloth;
  else throw ConfigError(source_name, "loss_tiling", fmt::format("expected liger, shards or unsloth, got '{}'", tiling));
  profile.moe_experts = moe_experts_parse(reader.get_string("moe_experts", "hf_expert_loop"), source_name, "moe_experts");
  profile.dataloader_host_bytes_per_token = reader.get_double("dataloader_host_bytes_per_token", 0, 1 << 20);
  profile.zero3_offload_gradient_buffer_bytes = reader.get_int("zero3_offload_gradient_buffer_bytes", 0, 8, 0);
  profile.host_process_runtime_gb = estimate_read(reader, "host_process_runtime_gb", 0, 1024, 0);
  profile.host_dataloader_workers_gb = estimate_read(reader, "host_dataloader_workers_gb", 0, 1024, 0);
  profile.host_forked_workers_copy_bytes_per_parameter =
      estimate_read(reader, "host_forked_workers_copy_bytes_per_parameter", 0, 64, 0);
  profile.pinned_host_allocations_power_of_two = reader.get_bool("pinned_host_allocations_power_of_two", false);
  profile.checkpoint_offload_reload_buffers = reader.get_int("checkpoint_offload_reload_buffers", 0, 2, 0);
  profile.checkpoint_offload_keeps_last_layer = reader.get_bool("checkpoint_offload_keeps_last_layer", false);
  profile.checkpoint_offload_pinned = reader.get_bool("checkpoint_offload_pinned", false);
  profile.rope_table_whole_sequence_fp32 = reader.get_bool("rope_table_whole_sequence_fp32", false);
  const std::string layer_code = reader.get_string("layer_code", "hf");
  if (layer_code != "hf" && layer_code != "megatron_te")
    throw ConfigError(source_name, "layer_code", fmt::format("expected hf or megatron_te, got '{}'", layer_code));
  profile.megatron_te_layer = layer_code == "megatron_te";
  profile.megatron_te_cross_entropy = reader.get_bool("megatron_te_cross_entropy", false);
  profile.megatron_fused_swiglu = reader.get_bool("megatron_fused_swiglu", true);
  profile.cpu_adam_bandwidth_efficiency = reader.get_double("cpu_adam_bandwidth_efficiency", 0.01, 1.0, 1.0);
  profile.qlora_unquantized_weight_bytes = reader.get_double("qlora_unquantized_weight_bytes", 2, 4, 4);
  if (profile.qlora_unquantized_weight_bytes != 2 && profile.qlora_unquantized_weight_bytes != 4)
    throw ConfigError(source_name, "qlora_unquantized_weight_bytes", "expected 2 (bf16) or 4 (fp32)");
  profile.qlora_adapter_bytes = reader.get_double("qlora_adapter_bytes", 2, 4, 4);
  if (profile.qlora_adapter_bytes != 2 && profile.qlora_adapter_bytes != 4)
    throw ConfigError(source_name, "qlora_adapter_bytes", "expected 2 (bf16) or 4 (fp32)");
  profile.attention_kernel = reader.get_string("attention_kernel", "");
  if (!profile.attention_kernel.empty() && !attention_kernel_known(profile.attention_kernel, true))
    throw ConfigError(source_name, "attention_kernel",
                      fmt::format("expected {}, got '{}'", attention_kernel_choices(true), profile.attention_kernel));
  profile.calibrated_reserve_gib = reader.get_double("calibrated_reserve_gib", 0, 1024, 0);
  profile.published_runs = reader.get_int("published_runs", 0, 1 << 20, 0);
  profile.published_evidence = reader.get_string("published_evidence", "");
  profile.usable_memory_headroom_gib = estimate_read(reader, "usable_memory_headroom_gib", 0, 1024, 0);
  profile.step_schedule = reader.get_string("step_schedule", "phases");
  if (profile.step_schedule != "phases" && profile.step_schedule != "executor")
    throw ConfigError(source_name, "step_schedule", fmt::format("expected phases or executor, got '{}'", profile.step_schedule));
  profile.attention_block_tokens = reader.get_int("attention_block_tokens", 0, int64_t{1} << 20, 0);
  reader.reject_unknown_keys();
  return profile;
}

std::string hardware_name_normalized(const std::string& name) {
  // Lower case, one '-' for each run of spaces, '-' or '_', the vendor's prefix dropped:
  // "NVIDIA A100-SXM4-80GB" and "a100 sxm4 80gb" are both a100-sxm4-80gb.
  std::string normalized;
  for (char c : name) {
    const bool separator = c == ' ' || c == '-' || c == '_';
    if (separator) {
      if (!normalized.empty() && normalized.back() != '-') normalized += '-';
    } else {
      normalized += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  while (!normalized.empty() && normalized.back() == '-') normalized.pop_back();
  if (normalized.rfind("nvidia-", 0) == 0) normalized.erase(0, 7);
  return normalized;
}

HardwareCard hardware_card_load(const std::string& name_or_path) {
  // A card's other names (nvidia-smi's, common spellings) before the files' names' beginnings; a
  // file or a built-in card's exact name (validation asks so, once a published point) reads one card.
  std::error_code error;
  const bool exact = std::filesystem::is_regular_file(name_or_path, error) || embedded_file_find(hardware_files(), name_or_path);
  if (!exact) {
    const std::string wanted = hardware_name_normalized(name_or_path);
    for (const EmbeddedFile& file : hardware_files()) {
      HardwareCard card = hardware_card_from_text(file.content, std::string("built-in hardware card ") + file.file_name);
      if (std::find(card.names.begin(), card.names.end(), wanted) != card.names.end()) return card;
    }
  }
  return load_named(name_or_path, hardware_files(), "hardware card", "--gpu", hardware_card_from_text);
}

RuntimeProfile runtime_profile_load(const std::string& name_or_path) {
  return load_named(name_or_path, profile_files(), "runtime profile", "--profile", runtime_profile_from_text);
}

std::vector<std::string> builtin_hardware_names() { return embedded_file_stems(hardware_files()); }
std::vector<std::string> builtin_profile_names() { return embedded_file_stems(profile_files()); }

}  // namespace longseq
