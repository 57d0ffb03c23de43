// LoRA adapters under DeepSpeed ZeRO (issue 40), by hand: beside ZeRO offload (ZeRO-Offload takes the
// adapters' fp32 master, gradients and AdamW moments to the host as it takes any trainable
// partition; offload_param every bf16 partition, frozen ones included), and QLoRA's 4-bit base
// partitioned by ZeRO-3 through bnb_4bit_quant_storage=bfloat16.
#include <doctest/doctest.h>

#include "models/adapters.hpp"
#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/frameworks.hpp"
#include "planner/memory_model.hpp"
#include "planner/time_model.hpp"
#include "support/memory_items.hpp"

using namespace longseq;
using testing::item_bytes;

namespace {

// Llama-3.1-8B on one node of 8 H100s, all of it on one sequence: Ulysses sp=8 under ZeRO-3 with
// checkpointing and a tiled loss, LoRA of rank 16 on every linear.
PlanOptions ulysses_zero3_lora() {
  PlanOptions plan;
  plan.sp = 8;
  plan.zero_stage = 3;
  plan.activation_checkpointing = true;
  plan.tiled_loss = true;
  plan.lora_rank = 16;
  return plan;
}

// The same plan as Accelerate's FSDP2 would run it: PyTorch's context parallelism over the 8 GPUs
// (cp, no Ulysses), without the tiled loss it has no switch for.
PlanOptions as_context_parallel(PlanOptions plan) {
  plan.sp = 1;
  plan.ring = 8;
  plan.tiled_loss = false;
  return plan;
}

}  // namespace

TEST_CASE("LoRA with ZeRO-3 optimizer and parameter offload: nothing of the model states on the GPU, the adapters' states on the host") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec node = cluster_make(hardware_card_load("h100-sxm-80gb"), 8, 0, 0, 0);
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  PlanOptions plan = ulysses_zero3_lora();  // the adapters: 16 x (in + out) summed over a layer's seven linears, 32 layers
  const double P = static_cast<double>(parameter_count(model).total), A = 41'943'040;
  REQUIRE(static_cast<double>(lora_parameter_count(model, 16, true)) == A);
  const MemoryPrediction on_gpu = memory_predict(model, node, plan, profile, 262'144);
  plan.offload_optimizer = plan.offload_params = true;
  REQUIRE(plan_problems(model, node, plan).empty());
  const MemoryPrediction offloaded = memory_predict(model, node, plan, profile, 262'144);
  for (const char* gone : {"base_weights", "lora_adapters", "lora_master_weights", "lora_gradients_fp32", "lora_optimizer_states"})
    CHECK(item_bytes(offloaded.gpu_items, gone) == 0);
  // The GPU gives up exactly those terms' bytes (2P/8 + 2A/8 + 4A/8 + 4A/8 + 8A/8), where the peak stays in the same phase.
  REQUIRE(offloaded.gpu_peak_phase == on_gpu.gpu_peak_phase);
  CHECK(on_gpu.gpu_peak_bytes - offloaded.gpu_peak_bytes == doctest::Approx((2 * P + 18 * A) / 8));
  // Host, 8 ranks on the node: each rank's partition of the adapters' fp32 master, moments and
  // gradients, ZeRO-3's flat gradient buffer of them, and the bf16 partitions of base and adapters
  // (offload_param's pinned buffer, in the profile's pinned allocator's rounding).
  CHECK(item_bytes(offloaded.host_items, "master_weights") == doctest::Approx(8 * 4 * A / 8));
  CHECK(item_bytes(offloaded.host_items, "optimizer_states") == doctest::Approx(8 * 8 * A / 8));
  CHECK(item_bytes(offloaded.host_items, "gradients_fp32") == doctest::Approx(8 * 4 * A / 8));
  CHECK(item_bytes(offloaded.host_items, "grad_partitions_flat_buffer") ==
        doctest::Approx(8 * A / 8 * static_cast<double>(profile.zero3_offload_gradient_buffer_bytes)));
  CHECK(item_bytes(offloaded.host_items, "weights") ==
        doctest::Approx(8 * pinned_host_allocation_bytes(2 * (P + A) / 8, profile.pinned_host_allocations_power_of_two)));
  // The optimizer step runs on the host over the adapters' partition alone: A / 8 parameters, not P / 8.
  PlanOptions full_model = plan;
  full_model.lora_rank = 0;
  const TimePrediction adapters_step = time_predict(model, node, plan, profile, 262'144);
  const TimePrediction full_step = time_predict(model, node, full_model, profile, 262'144);
  CHECK(adapters_step.time.optimizer_s == doctest::Approx(full_step.time.optimizer_s * A / P).epsilon(0.05));
  // Under DeepSpeed (Accelerate's); FSDP2's CPU offload with adapters and a 4-bit base offloaded are refused.
  CHECK(framework_unsupported(Framework::framework_hf_accelerate, model, plan, 8).empty());
  CHECK(framework_unsupported(Framework::framework_accelerate_fsdp2, model, as_context_parallel(plan), 8).find("adapters beside FSDP2's CPU offload") !=
        std::string::npos);
  plan.qlora = true;
  CHECK(plan_problems(model, node, plan).front().find("QLoRA beside optimizer/parameter offload") != std::string::npos);
}

TEST_CASE("QLoRA under ZeRO-3 (bf16 quant storage): the packed NF4 values partitioned and gathered as bf16, the quantization state whole on every rank") {
  // Reference §12 items 14 and 17-19: (n + 1) // 2 packed bytes a weight; with double quantization a
  // uint8 absmax per 64 values, an fp32 one per 256 of those, and small code tables, per tensor.
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec node = cluster_make(hardware_card_load("h100-sxm-80gb"), 8, 0, 0, 0);
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  PlanOptions plan = ulysses_zero3_lora();
  plan.qlora = true;
  REQUIRE(plan_problems(model, node, plan).empty());
  // Llama-3.1-8B's layer: q 4096x4096, k and v 4096x1024, o 4096x4096, gate and up 4096x14336, down 14336x4096.
  const double layer_weights = 2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 3.0 * 4096 * 14336;
  const double packed_layer = layer_weights / 2;  // every linear's count is even
  CHECK(nf4_layer_bytes(model, true).packed == packed_layer);
  const MemoryPrediction memory = memory_predict(model, node, plan, profile, 262'144);
  CHECK(item_bytes(memory.gpu_items, "base_linears_nf4_packed") == doctest::Approx(32 * packed_layer / 8));
  CHECK(item_bytes(memory.gpu_items, "base_linears_nf4_quant_state") == doctest::Approx(32 * nf4_layer_bytes(model, true).quant_state));
  // Per layer: one uint8 absmax per 64 weights, one fp32 per 256 of those, and per tensor (7) the
  // 16-entry fp32 code, the 256-entry nested code and the fp32 offset (every count divides evenly).
  CHECK(nf4_layer_bytes(model, true).quant_state == doctest::Approx(layer_weights / 64 + layer_weights / (64 * 256) * 4 + 7 * (16 * 4 + 256 * 4 + 4)));
  // The embedding, LM head and norms in prepare_model_for_kbit_training's fp32 (item 13), partitioned.
  const double other = static_cast<double>(parameter_count(model).total) - 32 * layer_weights;
  CHECK(item_bytes(memory.gpu_items, "base_other_weights_fp32") == doctest::Approx(other * 4 / 8));
  // A layer is gathered as its packed values and its two norms (fp32): a quarter of its bf16 bytes.
  CHECK(item_bytes(memory.gpu_items, "gathered_layer_weights") == doctest::Approx(packed_layer + 2.0 * 4096 * 4));
  // Its gathers move the packed bytes: less ZeRO traffic than the bf16 base's.
  PlanOptions bf16_base = plan;
  bf16_base.qlora = false;
  CHECK(memory.gpu_peak_bytes < memory_predict(model, node, bf16_base, profile, 262'144).gpu_peak_bytes);
  CHECK(framework_unsupported(Framework::framework_hf_accelerate, model, plan, 8).empty());
}

TEST_CASE("QLoRA under Accelerate's FSDP2 (bf16 quant storage): the packed values sharded and gathered a unit at a time, TRL's bf16 adapters and base") {
  // Accelerate 1.15's fsdp2_prepare_model shards a Params4bit whose storage is floating and skips
  // its fp32 upcast for such a model; TRL's SFTTrainer casts the adapters to bf16 and leaves the
  // unquantized weights in the model's bf16 (Reference §12 item 13).
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec node = cluster_make(hardware_card_load("h100-sxm-80gb"), 8, 0, 0, 0);
  const RuntimeProfile profile = runtime_profile_load("fsdp2-accelerate");
  PlanOptions plan = as_context_parallel(ulysses_zero3_lora());
  plan.qlora = true;
  REQUIRE(plan_problems(model, node, plan).empty());
  CHECK(framework_unsupported(Framework::framework_accelerate_fsdp2, model, plan, 8).empty());
  PlanOptions unsharded = plan;
  unsharded.zero_stage = 2;
  CHECK(framework_unsupported(Framework::framework_accelerate_fsdp2, model, unsharded, 8).find("FSDP2's full sharding") != std::string::npos);
  const double layer_weights = 2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 3.0 * 4096 * 14336;
  const double packed_layer = layer_weights / 2;
  const MemoryPrediction memory = memory_predict(model, node, plan, profile, 262'144, true);
  CHECK(item_bytes(memory.gpu_items, "base_linears_nf4_packed") == doctest::Approx(32 * packed_layer / 8));
  CHECK(item_bytes(memory.gpu_items, "base_linears_nf4_quant_state") == doctest::Approx(32 * nf4_layer_bytes(model, true).quant_state));
  const double other = static_cast<double>(parameter_count(model).total) - 32 * layer_weights;
  CHECK(item_bytes(memory.gpu_items, "base_other_weights_bf16") == doctest::Approx(other * 2 / 8));
  const double adapters = static_cast<double>(lora_parameter_count(model, 16, true));
  CHECK(item_bytes(memory.gpu_items, "lora_adapters_bf16") == doctest::Approx(adapters * 2 / 8));
  // A unit (the last layer's, prefetched for its backward at the loss's peak): the packed values in
  // their bf16 storage and the two norms in bf16.
  CHECK(memory.gpu_peak_phase == "logits and loss");
  CHECK(item_bytes(memory.gpu_items, "fsdp.prefetched_all_gather") == doctest::Approx(packed_layer + 2.0 * 4096 * 2));
  // Less than the bf16 base's plan; the export asks for the storage that makes it shardable.
  PlanOptions bf16_base = plan;
  bf16_base.qlora = false;
  CHECK(memory.gpu_peak_bytes < memory_predict(model, node, bf16_base, profile, 262'144).gpu_peak_bytes);
}
