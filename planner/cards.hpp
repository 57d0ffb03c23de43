// cards.hpp: the hardware cards (scenarios/hardware/*.yaml) and runtime profiles
// (planner/profiles/*.yaml), compiled into the binary and also loadable from a path.
//
// Units live in the names: _gib (2^30 bytes), _gbps (10^9 bytes per second), _tflops.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace longseq {

// One GPU type and the node it usually sits in. Sources are in the card files.
struct HardwareCard {
  std::string name;
  double gpu_memory_gib = 0;          // what the allocator can reach (nvidia-smi total)
  double peak_bf16_tflops = 0;        // dense
  int64_t gpus_per_node = 0;
  double host_memory_gib = 0;         // per node
  double pcie_host_to_device_gbps = 0;
  double pcie_device_to_host_gbps = 0;
  double nvlink_gbps = 0;             // unidirectional, per GPU
  double internode_gbps_per_node = 0; // unidirectional, per node
  // Achieved rates for the time model.
  double matmul_achieved_tflops = 0;        // measured max bf16 matmul (MAMF)
  double flash_attention_tflops_hd128 = 0;  // FlashAttention fwd+bwd, causal, FA FLOP convention
  double flash_attention_tflops_hd64 = 0;
  // FlashAttention-3 (Hopper only; 0: the card cannot run it), fwd+bwd causal, same convention.
  double flash_attention3_tflops_hd128 = 0;
  double flash_attention3_tflops_hd64 = 0;
  double hbm_gbps = 0;
  double nccl_intranode_busbw_gbps = 0;     // NCCL bus bandwidth inside a node
  double nccl_latency_us = 0;               // per collective (alpha)
  double host_memory_gbps = 0;              // host DRAM bandwidth per node (CPU optimizer step)
};

enum class LossTiling { loss_tiling_liger, loss_tiling_shards };

// How a runtime spends memory: dtypes, overheads outside the allocator, and the implementation
// choices that decide which tensors exist (see the profile files for the sources).
struct RuntimeProfile {
  std::string name;
  int64_t activation_bytes = 2;
  int64_t weight_bytes = 2;
  int64_t gradient_bytes = 4;         // the optimizer's gradient copy
  int64_t master_weight_bytes = 4;
  int64_t optimizer_state_bytes = 8;  // Adam m + v
  int64_t working_gradient_bytes = 2; // a weight gradient as backward produces it
  double cuda_context_gib = 0;
  double nccl_buffers_gib = 0;        // only when there is more than one rank
  double cublas_workspace_mib = 0;
  int64_t zero_reduce_bucket_elements = 0;
  int64_t zero_prefetch_bucket_elements = 0;
  int64_t ulysses_staging_copies = 2;
  bool flash_attention_dq_accumulator = false;
  bool flash_attention_expands_gqa_grads = false;
  bool fused_swiglu = false;
  LossTiling loss_tiling = LossTiling::loss_tiling_shards;
  double dataloader_host_bytes_per_token = 0;
  // Host memory DeepSpeed and the training process take beside the offloaded tensors, per rank
  // (REFERENCE §7.5; 0 / false where a runtime has none):
  // ZeRO-3 with the optimizer offloaded stages each reduce-scattered gradient partition in a flat
  // buffer of grad_accum_dtype (the model dtype by default) before the fp32 copy the step reads.
  int64_t zero3_offload_gradient_buffer_bytes = 0;
  double host_process_runtime_gb = 0;    // CUDA context and libraries, Python, NCCL host state (RSS)
  double host_dataloader_workers_gb = 0; // the DataLoader's worker processes
  // offload_param pins the bf16 flat parameter buffer, and PyTorch's pinned host allocator rounds
  // every pinned allocation up to a power of two.
  bool offloaded_params_pinned_power_of_two = false;
  // The host optimizer step's share of the node's DRAM bandwidth (CPU Adam is bandwidth-bound:
  // ~30 bytes moved per parameter); 1 = the theoretical bandwidth.
  double cpu_adam_bandwidth_efficiency = 1.0;
  // The attention kernel the stack runs: "fa2" (FlashAttention-2) or "fa3" (FlashAttention-3, on
  // cards that have its rate): its backward buffers (layer_inventory.hpp) and its speed.
  std::string attention_kernel = "fa2";
  // How a step's memory is predicted: "phases" replays the three heaviest phases of a framework
  // stack through the layer inventory; "executor" replays longseq's executor step, every layer.
  std::string step_schedule = "phases";
  // With the executor's schedule: the block of its blocked attention kernel, whose workspace it
  // allocates around each attention (kernels/blocked_attention.hpp); 0: a kernel without one.
  int64_t attention_block_tokens = 0;
  // CALIBRATED, not derived: GPU memory that grows with S costs this many times what the tensor
  // inventory adds up to (allocator and framework behaviour the inventory cannot see). 1 = none.
  double activation_overhead_factor = 1.0;
};

// Resolve a built-in card by name (case-insensitive, file stem) or read a YAML file by path.
// Throws ConfigError naming the file and key.
HardwareCard hardware_card_load(const std::string& name_or_path);
RuntimeProfile runtime_profile_load(const std::string& name_or_path);

HardwareCard hardware_card_from_text(const std::string& yaml_text, const std::string& source_name);
RuntimeProfile runtime_profile_from_text(const std::string& yaml_text, const std::string& source_name);

std::vector<std::string> builtin_hardware_names();
std::vector<std::string> builtin_profile_names();

}  // namespace longseq
