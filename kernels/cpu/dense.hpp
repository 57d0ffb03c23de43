// dense.hpp: embedding, linear layers and the SwiGLU activation on the CPU.
//
// Conventions for every kernel in kernels/cpu (llm.c's): one free function per op and direction;
// outputs first, inputs next, sizes last; row-major buffers with their shapes in comments; backward
// functions ADD into every gradient they produce (callers zero them), so tiled callers can sum
// tile contributions. Templated on the scalar: float for the executor, double for reference
// checks in tests. Size letters: T tokens, C input channels, OC output channels, V vocabulary.
#pragma once

#include <cstdint>

namespace longseq::kernels {

// out[T, C] = table[tokens[t], :]
template <typename Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* table, int64_t T, int64_t C);
// dtable[tokens[t], :] += dout[t, :]
template <typename Real>
void embedding_backward(Real* dtable, const Real* dout, const int32_t* tokens, int64_t T, int64_t C);

// out[T, OC] = inp[T, C] @ weight[OC, C]^T (+ bias[OC] when bias is not null)
template <typename Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int64_t T, int64_t C, int64_t OC);
// out[T, OC] += alpha * inp[T, C] @ weight[OC, C]^T (a LoRA adapter's product added to its base
// linear's output, scaled by lora_alpha / r)
template <typename Real>
void linear_forward_add(Real* out, const Real* inp, const Real* weight, Real alpha, int64_t T, int64_t C, int64_t OC);
// dinp[T, C] += alpha * dout @ weight; dweight[OC, C] += alpha * dout^T @ inp; dbias[OC] += alpha *
// sum_t dout (each may be null; alpha is 1 but for a scaled LoRA product)
template <typename Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp, const Real* weight, int64_t T,
                     int64_t C, int64_t OC, Real alpha = Real(1));

// out[N] = silu(gate) * up, silu(x) = x * sigmoid(x)
template <typename Real>
void swiglu_forward(Real* out, const Real* gate, const Real* up, int64_t N);
template <typename Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dout, const Real* gate, const Real* up, int64_t N);

}  // namespace longseq::kernels
