// lora.hpp: LoRA adapters beside a frozen linear, forward and backward. Its inventory:
// models/inventory/lora.cpp.
#pragma once

#include "executor/step/common.hpp"

namespace longseq::llama_step {

template <typename Act>
struct LayerAdapters {
  const Act* weights = nullptr;  // the adapters' buffer (lora_layout's offsets)
  float* gradients = nullptr;
  const std::array<LoraLayout::Adapter, kLayerLinears>* layer = nullptr;
  int64_t rank = 0;
  float scale = 0;
  const LoraLayout::Adapter* of(LayerLinearKind kind) const {
    if (!layer) return nullptr;
    const LoraLayout::Adapter& adapter = (*layer)[static_cast<size_t>(kind)];
    return adapter.present() ? &adapter : nullptr;
  }
};

// An adapted linear's forward after its base product: y += scale (x A^T) B^T, the r-wide x A^T
// kept in `kept` for the backward (null: released at once).
template <class Ops, typename Act>
void lora_forward(Ops& ops, Act* y, const Act* x, int64_t rows, const LayerAdapters<Act>& lora, LayerLinearKind kind, Arena& device,
                  BufferOf<Act>* kept) {
  const LoraLayout::Adapter* adapter = lora.of(kind);
  if (!adapter) return;
  BufferOf<Act> rank_values = device.allocate<Act>(L, executor_lora_rank_name(kLayerLinearNames[static_cast<size_t>(kind)]), rows * lora.rank);
  ops.linear_forward(rank_values.data(), x, lora.weights + adapter->a, rows, adapter->in, lora.rank);
  ops.linear_forward_add(y, rank_values.data(), lora.weights + adapter->b, rows, lora.rank, adapter->out, lora.scale);
  if (kept) *kept = std::move(rank_values);
}

// Its backward beside the base's: with u = x A^T, dB += s dy^T u and du = s dy B, then dA += du^T x
// and dx += du A. `rank_values` (u) is released.
template <class Ops, typename Act>
void lora_backward(Ops& ops, Act* dx, const Act* dy, const Act* x, int64_t rows, const LayerAdapters<Act>& lora, LayerLinearKind kind,
                   BufferOf<Act>& rank_values, Arena& device) {
  const LoraLayout::Adapter* adapter = lora.of(kind);
  if (!adapter) return;
  BufferOf<Act> rank_grad = device.allocate<Act>(L, "lora.rank_grad", rows * lora.rank, true);
  ops.linear_backward(rank_grad.data(), lora.gradients + adapter->b, dy, rank_values.data(), lora.weights + adapter->b, rows, lora.rank,
                      adapter->out, lora.scale);
  ops.linear_backward(dx, lora.gradients + adapter->a, rank_grad.data(), x, lora.weights + adapter->a, rows, adapter->in, lora.rank);
  rank_grad.release();
  rank_values.release();
}

}  // namespace longseq::llama_step
