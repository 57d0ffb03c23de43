// moe.hpp: a mixture-of-experts block's routing, dispatch and combine on the CPU (HF's
// MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock: a linear router, fp32 softmax, top-k,
// optionally renormalized; Reference §12 items 50-55). Conventions as in dense.hpp: backward
// functions ADD into the input gradients they produce, except where "written" is said.
//
// The dispatch is by rows: the T x k (token, choice) pairs sorted by expert (within an expert by
// token, then choice), so each expert's tokens are one contiguous block of rows. order[row] is
// the row's token; position[t * k + j] is the row of token t's j-th choice.
#pragma once

#include <cstdint>
#include <vector>

namespace longseq::kernels {

// probs[T, E] = softmax(logits[t, :]) (in Real); for each token its k largest, in descending order
// (ties to the lower expert): indices[T, k] and weights[T, k] = their probabilities, divided by
// their sum when `normalize` (Mixtral, Qwen3-MoE's norm_topk_prob; Qwen2-MoE keeps them as they are).
template <typename Real>
void moe_route(Real* weights, int32_t* indices, Real* probs, const Real* logits, int64_t T, int64_t E, int64_t k, bool normalize);
// dlogits[T, E] (written) from the weights' gradient dweights[T, k], through the renormalization
// (dp_i = (dw_i - sum_j dw_j w_j) / S over the chosen i) and the softmax.
template <typename Real>
void moe_route_backward(Real* dlogits, const Real* dweights, const Real* probs, const Real* weights, const int32_t* indices, int64_t T,
                        int64_t E, int64_t k, bool normalize);

// The dispatch (on the host: T x k int32 indices): order[T k], position[T k] and each expert's
// first row, offsets[E + 1].
struct MoeDispatch {
  std::vector<int32_t> order, position;
  std::vector<int64_t> offsets;
};
MoeDispatch moe_dispatch(const int32_t* indices, int64_t T, int64_t E, int64_t k);

// rows[r, :] = x[order[r], :] for R = T k rows (written).
template <typename Real>
void moe_gather(Real* rows, const Real* x, const int32_t* order, int64_t R, int64_t C);
// dx[t, :] += sum_j drows[position[t k + j], :] (each token's rows in choice order: deterministic).
template <typename Real>
void moe_gather_backward(Real* dx, const Real* drows, const int32_t* position, int64_t T, int64_t k, int64_t C);
// out[t, :] += sum_j weights[t, j] * rows[position[t k + j], :]
template <typename Real, typename Weight>
void moe_combine(Real* out, const Real* rows, const int32_t* position, const Weight* weights, int64_t T, int64_t k, int64_t C);
// drows[position[t k + j], :] = weights[t, j] * dout[t, :] (written); dweights[t, j] += dout[t, :] . rows[position[t k + j], :]
template <typename Real, typename Weight>
void moe_combine_backward(Real* drows, Weight* dweights, const Real* dout, const Real* rows, const int32_t* position, const Weight* weights,
                          int64_t T, int64_t k, int64_t C);

// Qwen2-MoE's gated shared expert: out[t, :] += sigmoid(gate[t]) * shared[t, :]; its backward
// writes dshared[t, :] = sigmoid(gate[t]) * dout[t, :] and dgate[t] = sigmoid' x dout[t, :] . shared[t, :].
template <typename Real>
void moe_shared_gate_forward(Real* out, const Real* shared, const Real* gate, int64_t T, int64_t C);
template <typename Real>
void moe_shared_gate_backward(Real* dshared, Real* dgate, const Real* dout, const Real* shared, const Real* gate, int64_t T, int64_t C);

}  // namespace longseq::kernels
