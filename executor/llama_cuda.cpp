// The training step of llama_step.hpp over the GPU's Ops (bf16 kernels, cuBLAS, side-stream
// checkpoint copies). Compiled wherever CUDA is; not run on a GPU yet.
#include "executor/llama_cuda.hpp"

#include "executor/llama_step.hpp"

namespace longseq {

template class BasicLlamaModel<CudaOps>;

}  // namespace longseq
