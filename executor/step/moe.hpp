// moe.hpp: the mixture-of-experts block (router, top-k, the tokens sorted by expert, the experts,
// the shared expert), forward and backward. Its inventory: models/inventory/moe.cpp.
#pragma once

#include "executor/step/common.hpp"

namespace longseq::llama_step {

// What a mixture-of-experts block keeps for its backward.
template <typename Act>
struct MoeSaved {
  Buffer probs, weights;                          // fp32 [T, E] and [T, K]
  BufferOf<int32_t> indices, order, position;     // [T, K], [T K], [T K]
  std::vector<int64_t> offsets;                   // host: each expert's first row of the dispatch
  BufferOf<Act> rows, gate, up, product, outputs;  // [T K, C], 3 x [T K, FE], [T K, C]
  BufferOf<Act> shared_gate, shared_up, shared_product, shared_output, shared_gate_logit;
};

// Calls run(expert's first parameter, first row, rows) for each expert that has rows in the
// dispatch (`offsets`: each expert's first row, then the total), expert e's parameters at
// experts + e x expert_parameters.
template <class Run>
void moe_each_expert(const std::vector<int64_t>& offsets, int64_t experts, int64_t expert_parameters, Run run) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t first = offsets[e], rows = offsets[e + 1] - first;
    if (rows > 0) run(experts + static_cast<int64_t>(e) * expert_parameters, first, rows);
  }
}

// A mixture-of-experts block (HF's MixtralSparseMoeBlock / Qwen2-3MoeSparseMoeBlock, grouped as
// transformers v5 and ArcticMoE run the experts; Reference §12 items 45-55): a linear router,
// fp32 softmax and top-K (renormalized when normalize_topk), the T K (token, choice) pairs sorted
// by expert on the host so each expert's rows are contiguous, every expert's SwiGLU over its rows
// of one [T K, ...] buffer (a fixed size whatever the routing: the schedule does not depend on the
// data), and the rows combined back by their routing weights; then the shared expert, gated by a
// sigmoid (Qwen2-MoE) or added. Adds into `output` (zeroed by the caller); with `saved` keeps what
// the backward reads.
template <class Ops, typename Act = typename Ops::Act>
void moe_forward(Ops& ops, const Act* params, const LlamaLayout::Layer& w, const Act* h, Act* output, const Dims& d, Arena& device,
                 MoeSaved<Act>* saved) {
  MoeSaved<Act> local;
  MoeSaved<Act>& s = saved ? *saved : local;
  const int64_t T = d.T, C = d.C, E = d.E, K = d.K, R = T * K, FE = d.FE, FS = d.FS;
  device.set_moment("forward: moe router");
  BufferOf<Act> logits = device.allocate<Act>(L, "moe.router_logits", T * E);
  ops.linear_forward(logits.data(), h, params + w.router, T, C, E);
  s.probs = device.allocate(L, "moe.router_probs", T * E);
  s.weights = device.allocate(L, "moe.routing_weights", R);
  s.indices = device.allocate<int32_t>(L, "moe.routing_indices", R);
  ops.moe_route(s.weights.data(), s.indices.data(), s.probs.data(), logits.data(), T, E, K, d.normalize_topk);
  logits.release();
  // The dispatch on the host (T K indices there and back): rows sorted by expert.
  std::vector<int32_t> host_indices(static_cast<size_t>(R));
  ops.to_host(host_indices.data(), s.indices.data(), R);
  const kernels::MoeDispatch dispatch = kernels::moe_dispatch(host_indices.data(), T, E, K);
  s.offsets = dispatch.offsets;
  s.order = device.allocate<int32_t>(L, "moe.dispatch_order", R);
  s.position = device.allocate<int32_t>(L, "moe.dispatch_positions", R);
  ops.to_device(s.order.data(), dispatch.order.data(), R);
  ops.to_device(s.position.data(), dispatch.position.data(), R);
  device.set_moment("forward: moe experts");
  s.rows = device.allocate<Act>(L, "moe.expert_inputs", R * C);
  ops.moe_gather(s.rows.data(), h, s.order.data(), R, C);
  s.gate = device.allocate<Act>(L, "moe.expert_gate", R * FE);
  s.up = device.allocate<Act>(L, "moe.expert_up", R * FE);
  auto each_expert = [&](auto run) { moe_each_expert(s.offsets, w.experts, 3 * FE * C, run); };
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_forward(s.gate.data() + first * FE, s.rows.data() + first * C, params + expert, rows, C, FE);
    ops.linear_forward(s.up.data() + first * FE, s.rows.data() + first * C, params + expert + FE * C, rows, C, FE);
  });
  s.product = device.allocate<Act>(L, "moe.expert_product", R * FE);
  ops.swiglu_forward(s.product.data(), s.gate.data(), s.up.data(), R * FE);
  s.outputs = device.allocate<Act>(L, "moe.expert_outputs", R * C);
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_forward(s.outputs.data() + first * C, s.product.data() + first * FE, params + expert + 2 * FE * C, rows, FE, C);
  });
  ops.moe_combine(output, s.outputs.data(), s.position.data(), s.weights.data(), T, K, C);
  if (!saved) {
    for (BufferOf<Act>* buffer : {&s.outputs, &s.product, &s.up, &s.gate, &s.rows}) buffer->release();
    s.position.release();
    s.order.release();
    s.indices.release();
    s.weights.release();
    s.probs.release();
  }
  if (FS == 0) return;
  device.set_moment("forward: moe shared expert");
  s.shared_gate = device.allocate<Act>(L, "moe.shared_gate", T * FS);
  s.shared_up = device.allocate<Act>(L, "moe.shared_up", T * FS);
  ops.linear_forward(s.shared_gate.data(), h, params + w.gate_proj, T, C, FS);
  ops.linear_forward(s.shared_up.data(), h, params + w.up_proj, T, C, FS);
  s.shared_product = device.allocate<Act>(L, "moe.shared_product", T * FS);
  ops.swiglu_forward(s.shared_product.data(), s.shared_gate.data(), s.shared_up.data(), T * FS);
  if (d.shared_gate) {
    s.shared_output = device.allocate<Act>(L, "moe.shared_output", T * C);
    ops.linear_forward(s.shared_output.data(), s.shared_product.data(), params + w.down_proj, T, FS, C);
    s.shared_gate_logit = device.allocate<Act>(L, "moe.shared_gate_logit", T);
    ops.linear_forward(s.shared_gate_logit.data(), h, params + w.shared_expert_gate, T, C, 1);
    ops.moe_shared_gate_forward(output, s.shared_output.data(), s.shared_gate_logit.data(), T, C);
  } else {
    ops.linear_forward_add(output, s.shared_product.data(), params + w.down_proj, T, FS, C, 1.0f);
  }
  if (!saved)
    for (BufferOf<Act>* buffer : {&s.shared_gate_logit, &s.shared_output, &s.shared_product, &s.shared_up, &s.shared_gate}) buffer->release();
}

// Its backward after moe_forward with `saved`: dy is the block's output gradient; adds the input
// gradient into dh and every weight's gradient into grads (null: frozen).
template <class Ops, typename Act = typename Ops::Act>
void moe_backward(Ops& ops, float* grads, const Act* params, const LlamaLayout::Layer& w, const Act* h, const Act* dy, Act* dh, const Dims& d,
                  Arena& device, MoeSaved<Act>& s) {
  const int64_t T = d.T, C = d.C, E = d.E, K = d.K, R = T * K, FE = d.FE, FS = d.FS;
  if (FS > 0) {
    device.set_moment("backward: moe shared expert");
    BufferOf<Act> product_grad = device.allocate<Act>(L, "moe.shared_product_grad", T * FS, true);
    if (d.shared_gate) {
      BufferOf<Act> output_grad = device.allocate<Act>(L, "moe.shared_output_grad", T * C);
      BufferOf<Act> logit_grad = device.allocate<Act>(L, "moe.shared_gate_logit_grad", T);
      ops.moe_shared_gate_backward(output_grad.data(), logit_grad.data(), dy, s.shared_output.data(), s.shared_gate_logit.data(), T, C);
      ops.linear_backward(dh, gradient_at(grads, w.shared_expert_gate), logit_grad.data(), h, params + w.shared_expert_gate, T, C, 1);
      logit_grad.release();
      s.shared_gate_logit.release();
      s.shared_output.release();
      ops.linear_backward(product_grad.data(), gradient_at(grads, w.down_proj), output_grad.data(), s.shared_product.data(), params + w.down_proj,
                          T, FS, C);
      output_grad.release();
    } else {
      ops.linear_backward(product_grad.data(), gradient_at(grads, w.down_proj), dy, s.shared_product.data(), params + w.down_proj, T, FS, C);
    }
    s.shared_product.release();
    BufferOf<Act> gate_grad = device.allocate<Act>(L, "moe.shared_gate_grad", T * FS, true);
    BufferOf<Act> up_grad = device.allocate<Act>(L, "moe.shared_up_grad", T * FS, true);
    ops.swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), s.shared_gate.data(), s.shared_up.data(), T * FS);
    product_grad.release();
    ops.linear_backward(dh, gradient_at(grads, w.gate_proj), gate_grad.data(), h, params + w.gate_proj, T, C, FS);
    ops.linear_backward(dh, gradient_at(grads, w.up_proj), up_grad.data(), h, params + w.up_proj, T, C, FS);
    for (BufferOf<Act>* buffer : {&up_grad, &gate_grad, &s.shared_up, &s.shared_gate}) buffer->release();
  }
  device.set_moment("backward: moe experts");
  auto each_expert = [&](auto run) { moe_each_expert(s.offsets, w.experts, 3 * FE * C, run); };
  BufferOf<Act> outputs_grad = device.allocate<Act>(L, "moe.expert_outputs_grad", R * C);
  Buffer weights_grad = device.allocate(L, "moe.routing_weights_grad", R, true);
  ops.moe_combine_backward(outputs_grad.data(), weights_grad.data(), dy, s.outputs.data(), s.position.data(), s.weights.data(), T, K, C);
  s.outputs.release();
  BufferOf<Act> product_grad = device.allocate<Act>(L, "moe.expert_product_grad", R * FE, true);
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_backward(product_grad.data() + first * FE, gradient_at(grads, expert + 2 * FE * C), outputs_grad.data() + first * C,
                        s.product.data() + first * FE, params + expert + 2 * FE * C, rows, FE, C);
  });
  outputs_grad.release();
  s.product.release();
  BufferOf<Act> gate_grad = device.allocate<Act>(L, "moe.expert_gate_grad", R * FE, true);
  BufferOf<Act> up_grad = device.allocate<Act>(L, "moe.expert_up_grad", R * FE, true);
  ops.swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), s.gate.data(), s.up.data(), R * FE);
  product_grad.release();
  BufferOf<Act> rows_grad = device.allocate<Act>(L, "moe.expert_inputs_grad", R * C, true);
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_backward(rows_grad.data() + first * C, gradient_at(grads, expert), gate_grad.data() + first * FE, s.rows.data() + first * C,
                        params + expert, rows, C, FE);
    ops.linear_backward(rows_grad.data() + first * C, gradient_at(grads, expert + FE * C), up_grad.data() + first * FE,
                        s.rows.data() + first * C, params + expert + FE * C, rows, C, FE);
  });
  for (BufferOf<Act>* buffer : {&up_grad, &gate_grad, &s.up, &s.gate}) buffer->release();
  ops.moe_gather_backward(dh, rows_grad.data(), s.position.data(), T, K, C);
  rows_grad.release();
  s.rows.release();
  s.position.release();
  s.order.release();
  device.set_moment("backward: moe router");
  BufferOf<Act> logits_grad = device.allocate<Act>(L, "moe.router_logits_grad", T * E);
  ops.moe_route_backward(logits_grad.data(), weights_grad.data(), s.probs.data(), s.weights.data(), s.indices.data(), T, E, K, d.normalize_topk);
  weights_grad.release();
  s.indices.release();
  s.weights.release();
  s.probs.release();
  ops.linear_backward(dh, gradient_at(grads, w.router), logits_grad.data(), h, params + w.router, T, C, E);
}

// One layer's LoRA adapters (none: full training).

}  // namespace longseq::llama_step
