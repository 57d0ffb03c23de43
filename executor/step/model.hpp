// model.hpp: BasicLlamaModel's states (weights, master copies, ZeRO shards, adapters) and its
// training step: embedding, the layers (layer.hpp), the final norm, logits and loss, backward and
// AdamW. Its inventory: models/inventory/replay.cpp and loss.cpp.
#pragma once

#include "executor/step/layer.hpp"

namespace longseq {

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device) : BasicLlamaModel(model, device, nullptr, {}, nullptr) {}

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator& zero_group)
    : BasicLlamaModel(model, device, &zero_group, ModelStates{3, false, false, {}}, nullptr) {}

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator& zero_group, Arena& optimizer_host)
    : BasicLlamaModel(model, device, &zero_group, ModelStates{3, true, false, {}}, &optimizer_host) {}

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator* zero_group, const ModelStates& states,
                                      Arena* host)
    : spec_(model), layout_(llama_layout(model)), lora_layout_(longseq::lora_layout(model, states.lora)), states_(states) {
  executor_model_check(model);
  if (lora()) {
    if (states.zero_stage != 0 || states.offload_optimizer || states.offload_params)
      throw std::invalid_argument("BasicLlamaModel: LoRA trains without ZeRO or offload here (executor_plan_problems reports this)");
    if (model.is_moe()) throw std::invalid_argument("BasicLlamaModel: LoRA on a mixture-of-experts model is not run here (plan_problems reports this)");
    // The frozen base in the kernels' dtype, alone; the adapters with what training needs: their
    // fp32 master (the adapters themselves on the CPU), gradients and AdamW moments (the planner's
    // names for them, planner/memory_model.cpp).
    plan_modules(1);
    const int64_t adapters = lora_layout_.total;
    weights_copy_ = device.template allocate<Act>(llama_step::kStates, "base_weights", padded_total(), true);
    adapters_ = device.template allocate<Act>(llama_step::kStates, Ops::kSeparateMasterWeights ? "lora_adapters" : "lora_adapters_fp32",
                                             adapters, true);
    if (Ops::kSeparateMasterWeights) master_ = device.allocate(llama_step::kStates, "lora_master_weights", adapters, true);
    gradients_ = device.allocate(llama_step::kStates, "lora_gradients_fp32", adapters, true);
    adam_m_ = device.allocate(llama_step::kStates, "lora_optimizer_states", adapters, true);
    adam_v_ = device.allocate(llama_step::kStates, "lora_optimizer_states", adapters, true);
    load_adapters(lora_initial_adapters(lora_layout_).data());
    return;
  }
  if (states.zero_stage < 0 || states.zero_stage > 3) throw std::invalid_argument("BasicLlamaModel: ZeRO stage must be 0..3");
  if (states.offload_optimizer && states.zero_stage < 1)
    throw std::invalid_argument("BasicLlamaModel: optimizer offload needs a ZeRO stage (plan_problems reports this)");
  if (states.offload_params && states.zero_stage != 3)
    throw std::invalid_argument("BasicLlamaModel: parameter offload needs ZeRO-3 (plan_problems reports this)");
  if ((states.offload_optimizer || states.offload_params) && !host) throw std::invalid_argument("BasicLlamaModel: offload needs a host pool");
  if (states.precision == PrecisionRegime::fsdp2 &&
      (states.zero_stage != 3 || states.offload_optimizer || states.offload_params || lora()))
    throw std::invalid_argument("BasicLlamaModel: FSDP2's regime shards fully (ZeRO stage 3) without offload or adapters here");
  cast_at_gather_ = states.precision == PrecisionRegime::fsdp2 && Ops::kSeparateMasterWeights;
  if (states.precision == PrecisionRegime::pure_bf16) {
    if (states.zero_stage != 0 || states.offload_optimizer || states.offload_params || lora())
      throw std::invalid_argument("BasicLlamaModel: the pure-bf16 regime runs without ZeRO, offload or adapters here");
    act_states_ = Ops::kSeparateMasterWeights;  // in fp32 it is the plain step
  }
  if (act_states_) {
    // bf16 weights, gradients and moments (the planner's names: weights, gradients_bf16,
    // optimizer_states), no master.
    plan_modules(1);
    weights_copy_ = device.template allocate<Act>(llama_step::kStates, "weights", layout_.total, true);
    gradients_act_ = device.template allocate<Act>(llama_step::kStates, "gradients_bf16", layout_.total, true);
    adam_m_act_ = device.template allocate<Act>(llama_step::kStates, "optimizer_states", layout_.total, true);
    adam_v_act_ = device.template allocate<Act>(llama_step::kStates, "optimizer_states", layout_.total, true);
    return;
  }
  if (states.zero_stage >= 1 && !zero_group) zero_group = &own_group_;  // ZeRO over one rank
  zero_group_ = states.zero_stage >= 1 ? zero_group : nullptr;
  const int64_t shard = plan_modules(zero_ranks());
  const int64_t whole = padded_total();
  // The kernels' weights (Act): this rank's shards under ZeRO-3, else the whole (padded) model;
  // on the device, or in the host pool with offload_param.
  Arena& weight_arena = states.offload_params ? *host : device;
  Arena& optimizer_arena = states.offload_optimizer ? *host : device;
  const int64_t optimizer_elements = states.zero_stage >= 1 ? shard : whole;
  if (cast_at_gather_) {
    // The fp32 shards are the parameters (the planner's "weights" at 4 bytes), and the optimizer's.
    master_ = device.allocate(llama_step::kStates, "weights", shard, true);
    gradients_ = device.allocate(llama_step::kStates, "gradients_fp32", shard, true);
    adam_m_ = device.allocate(llama_step::kStates, "optimizer_states", shard, true);
    adam_v_ = device.allocate(llama_step::kStates, "optimizer_states", shard, true);
    return;
  }
  weights_copy_ = weight_arena.template allocate<Act>(llama_step::kStates, "weights", weights_partitioned() ? shard : whole, true);
  // Mixed precision (DeepSpeed's bf16 mode), or an optimizer on the host: AdamW updates separate
  // fp32 master weights (sharded with the optimizer states) and the weights are written back.
  if (!master_is_weights()) {
    master_ = optimizer_arena.allocate(llama_step::kStates, "master_weights", optimizer_elements, true);
    master_on_host_ = states.offload_optimizer;
  } else {
    master_on_host_ = states.offload_params;
  }
  gradients_on_host_ = states.offload_optimizer;
  gradients_ = (gradients_on_host_ ? *host : device).allocate(llama_step::kStates, "gradients_fp32", gradients_partitioned() ? shard : whole, true);
  adam_m_ = optimizer_arena.allocate(llama_step::kStates, "optimizer_states", optimizer_elements, true);
  adam_v_ = optimizer_arena.allocate(llama_step::kStates, "optimizer_states", optimizer_elements, true);
}

template <class Ops>
bool BasicLlamaModel<Ops>::master_is_weights() const {
  return !Ops::kSeparateMasterWeights && !states_.offload_optimizer;
}

template <class Ops>
float* BasicLlamaModel<Ops>::master_data() {
  if constexpr (std::is_same_v<Act, float>) {
    if (lora() && !Ops::kSeparateMasterWeights) return adapters_.data();
    if (master_is_weights()) return weights_copy_.data();
  }
  return master_.data();
}

template <class Ops>
typename BasicLlamaModel<Ops>::Act* BasicLlamaModel<Ops>::weights() {
  return weights_copy_.data();
}

template <class Ops>
float* BasicLlamaModel<Ops>::module_master(const Module& module) {
  // The master weights are sharded with the optimizer (stage >= 1) unless they are the kernels'
  // whole weights, where this rank's chunk sits at its place in the padded module.
  if (master_is_weights() && !weights_partitioned()) return master_data() + own_chunk_start(module);
  return master_data() + module.shard_offset;
}

template <class Ops>
float* BasicLlamaModel<Ops>::module_gradient(const Module& module) {
  if (gradients_partitioned()) return gradients_.data() + module.shard_offset;
  return gradients_.data() + own_chunk_start(module);
}

template <class Ops>
void BasicLlamaModel<Ops>::weights_store(Act* destination, const Act* host_values, int64_t n) {
  if (states_.offload_params)
    std::copy_n(host_values, n, destination);
  else
    ops_.to_device(destination, host_values, n);
}

template <class Ops>
void BasicLlamaModel<Ops>::gradients_scale(float factor) {
  if (gradients_on_host_)
    for (int64_t i = 0; i < gradients_.size(); ++i) gradients_.data()[i] *= factor;
  else
    ops_.scale(gradients_.data(), gradients_.size(), factor);
}

template <class Ops>
int64_t BasicLlamaModel<Ops>::plan_modules(int64_t ranks) {
  modules_.clear();
  auto add = [&](int64_t start, int64_t end) {
    Module module;
    module.start = start;
    module.size = end - start;
    module.chunk = (module.size + ranks - 1) / ranks;
    if (!modules_.empty()) {
      module.shard_offset = modules_.back().shard_offset + modules_.back().chunk;
      module.padded_start = modules_.back().padded_start + modules_.back().chunk * ranks;
    }
    modules_.push_back(module);
  };
  add(layout_.embedding, layout_.embedding + spec_.vocab_size * spec_.hidden_size);
  for (size_t i = 0; i < layout_.layers.size(); ++i)
    add(layout_.layers[i].attention_norm, i + 1 < layout_.layers.size() ? layout_.layers[i + 1].attention_norm : layout_.final_norm);
  add(layout_.final_norm, layout_.total);
  return modules_.back().shard_offset + modules_.back().chunk;
}

template <class Ops>
void BasicLlamaModel<Ops>::load_parameters(const float* full) {
  // Built in host memory as a checkpoint is read: the whole model padded module by module, and
  // this rank's chunk of every module.
  const int64_t rank = zero_group_ ? zero_group_->rank() : 0;
  std::vector<float> padded(static_cast<size_t>(padded_total()), 0.0f);
  std::vector<float> shard(static_cast<size_t>(modules_.back().shard_offset + modules_.back().chunk), 0.0f);
  for (const Module& module : modules_) {
    std::copy_n(full + module.start, module.size, padded.data() + module.padded_start);
    for (int64_t i = 0; i < module.chunk; ++i) {
      const int64_t source = rank * module.chunk + i;
      shard[static_cast<size_t>(module.shard_offset + i)] = source < module.size ? full[module.start + source] : 0.0f;
    }
  }
  const std::vector<float>& own_weights = weights_partitioned() ? shard : padded;
  if (!master_is_weights() && !lora() && !act_states_) {  // (LoRA's master is the adapters'; pure bf16 has none)
    const std::vector<float>& own_master = states_.zero_stage >= 1 ? shard : padded;
    if (master_on_host_)
      std::copy(own_master.begin(), own_master.end(), master_.data());
    else
      ops_.to_device(master_.data(), own_master.data(), master_.size());
  }
  if (cast_at_gather_) return;  // no bf16 copy to keep
  if constexpr (std::is_same_v<Act, float>) {
    weights_store(weights(), own_weights.data(), weights_copy_.size());
  } else {
    // The weights in Act, converted on the device from the fp32 values (as the GPU rounds them).
    ops_.weights_from_host_master(weights(), own_weights.data(), weights_copy_.size());
  }
}

template <class Ops>
void BasicLlamaModel<Ops>::load_adapters(const float* full) {
  if (!lora()) throw std::invalid_argument("load_adapters: this model has no LoRA adapters");
  const int64_t n = lora_layout_.total;
  if constexpr (std::is_same_v<Act, float>) {
    ops_.to_device(adapters_.data(), full, n);
    if (Ops::kSeparateMasterWeights) ops_.to_device(master_.data(), full, n);
  } else {
    ops_.to_device(master_.data(), full, n);
    ops_.weights_from_host_master(adapters_.data(), full, n);
  }
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::gather_full(const float* shard) {
  std::vector<float> full(static_cast<size_t>(layout_.total));
  const bool on_host = (shard == master_.data() && master_on_host_) || (shard == gradients_.data() && gradients_on_host_) ||
                       (master_is_weights() && shard == master_data() && master_on_host_);
  if (!zero_group_) {
    if (on_host) std::copy_n(shard, layout_.total, full.data());
    else ops_.to_host(full.data(), shard, layout_.total);
    return full;
  }
  // Offloaded states are in host memory; the collectives (NCCL on a GPU) take device memory.
  const int64_t shard_size = modules_.back().shard_offset + modules_.back().chunk;
  auto staged = ops_.template scratch<float>(on_host ? shard_size : 0);
  if (on_host) {
    ops_.to_device(staged.data(), shard, shard_size);
    shard = staged.data();
  }
  for (const Module& module : modules_) {
    auto gathered = ops_.template scratch<float>(module.chunk * zero_group_->size());
    zero_group_->all_gather(shard + module.shard_offset, gathered.data(), module.chunk);
    ops_.to_host(full.data() + module.start, gathered.data(), module.size);
  }
  return full;
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::fp32_to_host(const float* values, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  ops_.to_host(host.data(), values, n);
  return host;
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::act_to_host(const Act* values, int64_t n) {
  auto wide = ops_.template scratch<float>(n);
  ops_.fill_zero(wide.data(), n);
  ops_.accumulate(wide.data(), values, n);
  return fp32_to_host(wide.data(), n);
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::parameters_full() {
  if (act_states_) return act_to_host(weights(), layout_.total);
  if (lora()) return fp32_to_host(master_data(), lora_layout_.total);
  if (!master_is_weights() && states_.zero_stage >= 1) return gather_full(master_.data());
  if (weights_partitioned()) return gather_full(master_data());
  // The whole (padded) vector is here: the master weights of stage 0, or the kernels' weights.
  std::vector<float> full(static_cast<size_t>(layout_.total));
  const float* whole = master_data();
  for (const Module& module : modules_) {
    if (master_on_host_) std::copy_n(whole + module.padded_start, module.size, full.data() + module.start);
    else ops_.to_host(full.data() + module.start, whole + module.padded_start, module.size);
  }
  return full;
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::gradients_full() {
  if (act_states_) return act_to_host(gradients_act_.data(), layout_.total);
  if (lora()) return fp32_to_host(gradients_.data(), lora_layout_.total);
  if (gradients_partitioned()) return gather_full(gradients_.data());
  std::vector<float> full(static_cast<size_t>(layout_.total));
  for (const Module& module : modules_) ops_.to_host(full.data() + module.start, gradients_.data() + module.padded_start, module.size);
  return full;
}

template <class Ops>
StepResult BasicLlamaModel<Ops>::forward_backward(const int32_t* host_tokens, const int32_t* host_labels,
                                                  const int32_t* host_positions, int64_t T, const TrainingOptions& options,
                                                  Arena& device, Arena& host, const SequenceParallel& parallel) {
  using namespace llama_step;
  const ModelSpec& m = spec_;
  Dims d{T, m.hidden_size, m.q_width(), m.kv_width(), m.num_q_heads, m.num_kv_heads, m.head_dim, m.intermediate_size, m.vocab_size};
  if (m.is_moe()) {
    d.E = m.experts;
    d.K = m.experts_per_token;
    d.FE = m.expert_intermediate_size;
    d.FS = m.shared_expert_intermediate_size;
    d.shared_gate = m.shared_expert_gate;
    d.normalize_topk = m.moe_normalize_topk;
    if (options.mlp_tiles > 0 || options.fpdt_chunk_tokens > 0)
      throw std::invalid_argument("forward_backward: a mixture-of-experts block runs untiled, without FPDT (plan_problems reports this)");
  }
  Ops& ops = ops_;
  // The step's int32 inputs where its kernels read them (beside the arena: they are not part of
  // the executor's predicted schedule, REFERENCE counts them under "inputs").
  auto upload = [&](const int32_t* values, int64_t n) {
    auto copy = ops.template scratch<int32_t>(n);
    ops.to_device(copy.data(), values, n);
    return copy;
  };
  const auto tokens_on_device = upload(host_tokens, T), labels_on_device = upload(host_labels, T),
             positions_on_device = upload(host_positions, T);
  const int32_t* tokens = tokens_on_device.data();
  const int32_t* labels = labels_on_device.data();
  const int32_t* positions = positions_on_device.data();
  // Where a module's weights and gradients are for this step. Under ZeRO-3 a module is
  // all-gathered into "gathered_layer_weights" when it runs (its shard first brought from the host
  // pool with offload_param) and released after; otherwise it is read in place from the whole
  // (padded) weights. With partitioned gradients (ZeRO-2/3, or an offloaded optimizer) a module's
  // gradient is produced whole in "weight_gradient" and reduce-scattered into this rank's shard
  // (summing every rank's part); otherwise it accumulates in place in the whole gradients.
  // A module's kernels read its tensors at offsets relative to the module (rebased).
  if (gradients_on_host_)
    std::fill_n(gradients_.data(), gradients_.size(), 0.0f);  // host memory
  else
    ops.fill_zero(gradients_.data(), gradients_.size());
  if (act_states_) ops.fill_zero(gradients_act_.data(), gradients_act_.size());
  // The base's gradients (null with LoRA: the base is frozen, gradients_ holds the adapters'; and
  // in the pure-bf16 regime, where each module's is produced in fp32 and added in: module_gradients).
  float* grads = lora() || act_states_ ? nullptr : gradients_.data();
  if (lora() && (options.mlp_tiles > 0 || options.fpdt_chunk_tokens > 0))
    throw std::invalid_argument("forward_backward: LoRA runs untiled MLPs without FPDT here (executor_plan_problems reports this)");
  auto layer_adapters = [&](int64_t layer) {
    LayerAdapters<Act> adapters;
    if (!lora()) return adapters;
    adapters.weights = adapters_.data();
    adapters.gradients = gradients_.data();
    adapters.layer = &lora_layout_.layers[static_cast<size_t>(layer)];
    adapters.rank = lora_layout_.rank;
    adapters.scale = lora_layout_.scale;
    return adapters;
  };
  const int64_t layers = m.num_layers;
  const bool gather_weights = weights_partitioned();
  const bool scatter_gradients = gradients_partitioned();
  auto gather = [&](size_t index, const char* name = "gathered_layer_weights") {
    const Module& module = modules_[index];
    BufferOf<Act> gathered = device.allocate<Act>(kCategoryZero, name, module.chunk * zero_group_->size());
    // (FSDP2's regime keeps no bf16 shard: weights() is empty there.)
    const Act* shard = cast_at_gather_ ? nullptr : weights() + module.shard_offset;
    BufferOf<Act> staged;
    if (cast_at_gather_) {  // FSDP2: the fp32 shard cast to bf16 for its all-gather
      staged = device.allocate<Act>(kCategoryZero, "fsdp.cast_shard", module.chunk);
      ops.weights_from_master(staged.data(), master_.data() + module.shard_offset, module.chunk);
      shard = staged.data();
    } else if (states_.offload_params) {
      staged = device.allocate<Act>(kCategoryZero, "offloaded_weights_in_flight", module.chunk);
      ops.to_device(staged.data(), shard, module.chunk);
      shard = staged.data();
    }
    zero_group_->all_gather(shard, gathered.data(), module.chunk);
    return gathered;
  };
  // The module's weights for its kernels: gathered into `holder`, or in place.
  auto module_weights = [&](size_t index, BufferOf<Act>& holder, const char* name = "gathered_layer_weights") -> const Act* {
    if (!gather_weights) return weights() + modules_[index].padded_start;
    holder = gather(index, name);
    return holder.data();
  };
  auto gradient_buffer = [&](size_t index, const char* name = "weight_gradient") {
    return device.allocate(kCategoryZero, name, modules_[index].chunk * zero_group_->size(), true);
  };
  auto module_gradients = [&](size_t index, Buffer& holder, const char* name = "weight_gradient") -> float* {
    if (act_states_) {
      holder = device.allocate(L, "module_gradient_fp32", modules_[index].size, true);
      return holder.data();
    }
    if (!scatter_gradients) return gradient_at(grads, modules_[index].padded_start);
    holder = gradient_buffer(index, name);
    return holder.data();
  };
  auto scatter = [&](size_t index, Buffer& gradient) {
    if (act_states_) {  // the pure-bf16 regime: into the bf16 gradients, rounded once
      ops.gradient_add_to_act(gradients_act_.data() + modules_[index].start, gradient.data(), modules_[index].size);
      gradient.release();
      return;
    }
    if (!scatter_gradients) return;
    const Module& module = modules_[index];
    Buffer part = device.allocate(kCategoryZero, "gradient_shard_in_flight", module.chunk);
    zero_group_->reduce_scatter(gradient.data(), part.data(), module.chunk);
    if (gradients_on_host_) {  // to the host shard, as ZeRO-Offload moves each reduced partition
      std::vector<float> arrived(static_cast<size_t>(module.chunk));
      ops.to_host(arrived.data(), part.data(), module.chunk);
      for (int64_t i = 0; i < module.chunk; ++i) gradients_.data()[module.shard_offset + i] += arrived[static_cast<size_t>(i)];
    } else {
      ops.add(gradients_.data() + module.shard_offset, part.data(), module.chunk);
    }
    gradient.release();
  };
  // A layer's offsets relative to its module, for running it on the module's weights.
  auto rebased = [&](size_t layer) {
    LlamaLayout::Layer w = layout_.layers[layer];
    const int64_t start = modules_[1 + layer].start;
    for (int64_t* offset : {&w.attention_norm, &w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.mlp_norm, &w.gate_proj, &w.up_proj,
                            &w.down_proj})
      *offset -= start;
    for (int64_t* offset : {&w.router, &w.experts, &w.shared_expert_gate})
      if (*offset >= 0) *offset -= start;
    return w;
  };
  const size_t final_module = static_cast<size_t>(layers) + 1;
  Ulysses ulysses;
  auto global_positions_on_device = ops.template scratch<int32_t>(0);
  if (parallel.group && parallel.group->size() > 1) {
    ulysses.group = parallel.group;
    ulysses.sp = parallel.group->size();
    if (m.num_q_heads % ulysses.sp != 0 || (m.num_kv_heads % ulysses.sp != 0 && ulysses.sp % m.num_kv_heads != 0))
      throw std::invalid_argument("forward_backward: sp breaks Ulysses' head rules (plan_problems reports this)");
    ulysses.q_heads = m.num_q_heads / ulysses.sp;
    ulysses.replication = ulysses.sp > m.num_kv_heads ? ulysses.sp / m.num_kv_heads : 1;
    ulysses.kv_heads = ulysses.replication > 1 ? 1 : m.num_kv_heads / ulysses.sp;
  }
  if (parallel.ring_group && parallel.ring_group->size() > 1) {
    ulysses.ring_group = parallel.ring_group;
    ulysses.ring = parallel.ring_group->size();
    ulysses.ring_rank = parallel.ring_group->rank();
    if (options.fpdt_chunk_tokens > 0) throw std::invalid_argument("forward_backward: FPDT with ring attention is not in the executor");
  }
  if (act_states_ && (ulysses.active() || ulysses.ring_active()))
    throw std::invalid_argument("forward_backward: the pure-bf16 regime runs on one rank here (its bf16 gradients are not summed across ranks)");
  if (ulysses.active() || ulysses.ring_active()) {
    if (!parallel.global_positions) throw std::invalid_argument("forward_backward: sequence parallelism needs the global position ids");
    global_positions_on_device = upload(parallel.global_positions, T * ulysses.sp * ulysses.ring);
    ulysses.global_positions = global_positions_on_device.data();
  }
  // Sums over every rank of the sequence: the Ulysses group, then the ring of such groups.
  auto sequence_sum = [&](auto* values, int64_t count) {
    if (ulysses.active()) ulysses.group->all_reduce(values, count);
    if (ulysses.ring_active()) ulysses.ring_group->all_reduce(values, count);
  };

  // Forward. With checkpointing only each layer's input survives (on the device, or copied to
  // the host pool); without it every layer keeps what its backward reads.
  BufferOf<Act> x = device.allocate<Act>(L, "layer.input", T * d.C);
  {
    BufferOf<Act> table;
    ops.embedding_forward(x.data(), tokens, module_weights(0, table), T, d.C);
  }
  std::vector<BufferOf<Act>> inputs(static_cast<size_t>(layers));
  std::vector<LayerSaved<Act>> saved(options.activation_checkpointing ? 0 : static_cast<size_t>(layers));
  // Checkpoint offload is asynchronous: a layer's input is copied to the host while the next
  // layer computes, and its device buffer is released only once that layer is done (one extra
  // checkpoint on the device: the price of the overlap ALST's blocking copy does without).
  BufferOf<Act> offload_in_flight;
  typename Ops::PendingCopy offload_copy{};
  for (int64_t i = 0; i < layers; ++i) {
    BufferOf<Act> gathered;
    const Act* layer_params = module_weights(1 + static_cast<size_t>(i), gathered);
    const LlamaLayout::Layer w = rebased(static_cast<size_t>(i));
    BufferOf<Act> y = layer_forward(ops, layer_params, w, x.data(), positions, d, options, device, host,
                                    options.activation_checkpointing ? nullptr : &saved[static_cast<size_t>(i)], ulysses, layer_adapters(i));
    gathered.release();
    if (options.progress) options.progress("forward", i + 1, layers);
    if (options.checkpoint_offload) {
      if (!offload_in_flight.empty()) {
        ops.copy_wait(offload_copy);
        offload_in_flight.release();
      }
      BufferOf<Act> copy = host.allocate<Act>(kCategoryCheckpoints, "hidden_states_checkpoints", T * d.C);
      offload_copy = ops.copy_to_host_begin(copy.data(), x.data(), T * d.C);
      device.rename(x, "checkpoint.offload_in_flight");
      offload_in_flight = std::move(x);
      inputs[static_cast<size_t>(i)] = std::move(copy);
    } else {
      inputs[static_cast<size_t>(i)] = std::move(x);
    }
    x = std::move(y);
  }
  if (!offload_in_flight.empty()) {
    ops.copy_wait(offload_copy);
    offload_in_flight.release();
  }

  // Final norm, logits and loss; the gradient comes back into the last layer's output.
  device.set_moment("loss: logits and cross entropy");
  // The loss is the mean over every counted token of the sample: with Ulysses the count is summed
  // over the ranks first (ranks whose tokens are all ignored included), so each rank's gradient is
  // its share of the same mean.
  StepResult result;
  for (int64_t t = 0; t < T; ++t) result.counted_tokens += host_labels[t] != kernels::kIgnoreIndex;
  {
    double count = static_cast<double>(result.counted_tokens);
    sequence_sum(&count, 1);
    result.counted_tokens = static_cast<int64_t>(count);
  }
  const float loss_scale = result.counted_tokens > 0 ? 1.0f / static_cast<float>(result.counted_tokens) : 0.0f;
  // Where the final norm and the LM head (and their gradients) are for this step.
  BufferOf<Act> final_weights, tied_weights;
  Buffer final_gradient, tied_gradient;
  // The final module holds the norm and (untied) the LM head; a tied head is the embedding's.
  const Act* final_norm_weight = module_weights(final_module, final_weights);
  float* final_norm_grad = module_gradients(final_module, final_gradient);
  const Act* lm_head_weight = final_norm_weight + (layout_.lm_head - layout_.final_norm);
  float* lm_head_grad = gradient_at(final_norm_grad, layout_.lm_head - layout_.final_norm);
  if (m.tied_embeddings) {
    lm_head_weight = module_weights(0, tied_weights, "gathered_embedding_weights");
    lm_head_grad = module_gradients(0, tied_gradient, "embedding_weight_gradient");
  }
  BufferOf<Act> final_output = device.allocate<Act>(kCategoryLoss, "final_norm.output", T * d.C);
  Buffer final_rstd = device.allocate(kCategoryLoss, "final_norm.rstd", T);
  ops.rmsnorm_forward(final_output.data(), final_rstd.data(), x.data(), final_norm_weight, T, d.C, options.rmsnorm_eps);
  BufferOf<Act> final_grad = device.allocate<Act>(kCategoryLoss, "final_norm.output_grad", T * d.C, true);
  const int64_t loss_tile = options.loss_tile_tokens > 0 ? std::min(options.loss_tile_tokens, T)
                            : options.loss_tiles > 0     ? tile_size(T, options.loss_tiles)
                                                         : T;
  double loss_sum = 0;
  for (int64_t t0 = 0; t0 < T; t0 += loss_tile) {
    const int64_t rows = std::min(loss_tile, T - t0);
    BufferOf<Act> logits = device.allocate<Act>(kCategoryLoss, "loss.logits", rows * d.V);
    ops.linear_forward(logits.data(), final_output.data() + t0 * d.C, lm_head_weight, rows, d.C, d.V);
    Buffer losses = device.allocate(kCategoryLoss, "loss.per_token", rows);
    ops.cross_entropy_forward(losses.data(), logits.data(), labels + t0, rows, d.V);
    loss_sum += ops.sum(losses.data(), rows);
    BufferOf<Act> logits_grad = device.allocate<Act>(kCategoryLoss, "loss.logits_grad", rows * d.V, true);
    ops.cross_entropy_backward(logits_grad.data(), logits.data(), labels + t0, loss_scale, rows, d.V);
    logits.release();
    ops.linear_backward(final_grad.data() + t0 * d.C, lm_head_grad, logits_grad.data(), final_output.data() + t0 * d.C, lm_head_weight,
                        rows, d.C, d.V);
  }
  sequence_sum(&loss_sum, 1);
  result.loss = result.counted_tokens > 0 ? loss_sum / static_cast<double>(result.counted_tokens) : 0.0;
  final_output.release();
  BufferOf<Act> dy = device.allocate<Act>(L, "layer.output_grad", T * d.C, true);
  ops.rmsnorm_backward(dy.data(), final_norm_grad, final_grad.data(), x.data(), final_norm_weight, final_rstd.data(), T, d.C);
  scatter(final_module, final_gradient);
  if (m.tied_embeddings) scatter(0, tied_gradient);
  final_weights.release();
  tied_weights.release();
  final_grad.release();
  final_rstd.release();
  x.release();

  // Backward, last layer first; with checkpointing each layer is recomputed from its input. An
  // offloaded input is prefetched one layer ahead, its copy overlapping this layer's backward.
  BufferOf<Act> prefetched;
  typename Ops::PendingCopy prefetch_copy{};
  auto prefetch = [&](int64_t layer) {
    prefetched = device.allocate<Act>(L, "checkpoint.prefetched", T * d.C);
    prefetch_copy = ops.copy_to_device_begin(prefetched.data(), inputs[static_cast<size_t>(layer)].data(), T * d.C);
  };
  if (options.checkpoint_offload && layers > 0) prefetch(layers - 1);
  for (int64_t i = layers - 1; i >= 0; --i) {
    BufferOf<Act> gathered;
    Buffer layer_gradient;
    const Act* layer_params = module_weights(1 + static_cast<size_t>(i), gathered);
    float* layer_grads = module_gradients(1 + static_cast<size_t>(i), layer_gradient);
    const LlamaLayout::Layer w = rebased(static_cast<size_t>(i));
    BufferOf<Act> input = std::move(inputs[static_cast<size_t>(i)]);
    if (options.checkpoint_offload) {
      ops.copy_wait(prefetch_copy);
      ops.copy_finish(prefetch_copy);  // the host copy may be reused once the device has it
      input.release();
      device.rename(prefetched, "layer.input");
      input = std::move(prefetched);
      if (i > 0) prefetch(i - 1);
    }
    LayerSaved<Act> recomputed;
    LayerSaved<Act>& layer_saved = options.activation_checkpointing ? recomputed : saved[static_cast<size_t>(i)];
    if (options.activation_checkpointing) {
      BufferOf<Act> output =
          layer_forward(ops, layer_params, w, input.data(), positions, d, options, device, host, &recomputed, ulysses, layer_adapters(i));
      output.release();
    }
    BufferOf<Act> dx =
        layer_backward(ops, layer_grads, layer_params, w, input.data(), dy.data(), positions, d, options, device, host, layer_saved, ulysses,
                       layer_adapters(i));
    dy = std::move(dx);
    scatter(1 + static_cast<size_t>(i), layer_gradient);
    if (options.progress) options.progress("backward", layers - i, layers);
  }
  {
    Buffer table_gradient;
    if (float* table_grad = module_gradients(0, table_gradient)) ops.embedding_backward(table_grad, dy.data(), tokens, T, d.C);
    scatter(0, table_gradient);
  }
  // Every rank saw different tokens with the same weights: whole gradients are summed over the
  // sequence's ranks here (partitioned ones were summed by their reduce-scatter).
  if (!scatter_gradients) sequence_sum(gradients_.data(), gradients_.size());
  return result;
}

template <class Ops>
void BasicLlamaModel<Ops>::adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay) {
  ++step_;
  if (act_states_) {  // bf16 parameters, gradients and moments
    ops_.adamw_update_act(weights(), gradients_act_.data(), adam_m_act_.data(), adam_v_act_.data(), layout_.total, lr, beta1, beta2, eps,
                          weight_decay, step_);
    return;
  }
  if (lora()) {  // the adapters alone
    ops_.adamw_update(master_data(), adapters_.data(), gradients_.data(), adam_m_.data(), adam_v_.data(), lora_layout_.total, lr, beta1,
                      beta2, eps, weight_decay, step_);
    return;
  }
  if (states_.offload_optimizer) {  // on the host (DeepSpeed's cpu_adam), then the weights go back
    kernels::adamw_update(master_.data(), gradients_.data(), adam_m_.data(), adam_v_.data(), master_.size(), lr, beta1, beta2, eps,
                          weight_decay, step_);
    // (With offload_param the weights are in the host pool too; the same call writes them there.)
    if (weights_partitioned()) {
      ops_.weights_from_host_master(weights(), master_.data(), master_.size());
      return;
    }
    for (const Module& module : modules_)
      ops_.weights_from_host_master(weights() + own_chunk_start(module), master_.data() + module.shard_offset, module.chunk);
  } else if (weights_partitioned() || !zero_group_) {
    // Every value this rank updates is contiguous: its ZeRO-3 shard, or the whole model.
    ops_.adamw_update(master_data(), weights(), gradients_.data(), adam_m_.data(), adam_v_.data(), adam_m_.size(), lr, beta1, beta2, eps,
                      weight_decay, step_);
    return;
  } else {
    // ZeRO-1/2: this rank's chunk of every module, where its master and gradient chunks are.
    for (const Module& module : modules_)
      ops_.adamw_update(module_master(module), weights() + own_chunk_start(module), module_gradient(module),
                        adam_m_.data() + module.shard_offset, adam_v_.data() + module.shard_offset, module.chunk, lr, beta1, beta2, eps,
                        weight_decay, step_);
  }
  // ZeRO-1/2: every rank's updated chunks make the whole weights again (DeepSpeed's all-gather of
  // the updated partitions). The send chunk is copied out first: it lies inside the receive buffer.
  for (const Module& module : modules_) {
    auto own = ops_.template scratch<Act>(module.chunk);
    ops_.copy(own.data(), weights() + own_chunk_start(module), module.chunk);
    zero_group_->all_gather(own.data(), weights() + module.padded_start, module.chunk);
  }
}

}  // namespace longseq
