// common.hpp: what every block of the executor's step (executor/step/) shares: the layer's
// dimensions, the trace categories, a frozen base's missing gradient.
#pragma once

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "executor/llama.hpp"
#include "executor/ulysses.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "models/layer_inventory.hpp"

namespace longseq::llama_step {

inline constexpr const char* kStates = kCategoryModelStates;
inline constexpr const char* L = kCategoryLayer;

struct Dims {
  int64_t T, C, Q, KV, NQ, NKV, HD, F, V;
  // A mixture-of-experts block (E 0: the dense MLP): E experts of width FE, K per token, a shared
  // expert of width FS (0: none), gated by a sigmoid when shared_gate.
  int64_t E = 0, K = 0, FE = 0, FS = 0;
  bool shared_gate = false, normalize_topk = true;
};

// A base weight's gradient, or null where the base is frozen (LoRA).
inline float* gradient_at(float* gradients, int64_t offset) { return gradients ? gradients + offset : nullptr; }

}  // namespace longseq::llama_step
