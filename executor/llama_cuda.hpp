// llama_cuda.hpp: the executor's model on a GPU: BasicLlamaModel (llama.hpp) over CudaOps, with
// bf16 activations and weights, fp32 gradients, master weights and Adam moments. Its device arena
// takes CudaDeviceMemoryBackend and its host pool PinnedHostMemoryBackend (cuda_memory.hpp).
#pragma once

#include "executor/cuda_ops.hpp"
#include "executor/llama.hpp"

namespace longseq {

using CudaLlamaModel = BasicLlamaModel<CudaOps>;
extern template class BasicLlamaModel<CudaOps>;

}  // namespace longseq
