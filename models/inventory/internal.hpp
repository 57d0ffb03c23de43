// internal.hpp: what the decoder layer's inventory files share (models/inventory/*.cpp): the sizes of
// its tensors, the eager RMSNorm's and a frozen base's saving rules, the projections and the
// Ulysses all-to-all every block uses, LoRA's per-linear names, and each block's entry points.
// Not a public header: models/layer_inventory.hpp is the inventory's interface. Each step of every
// block cites the code whose allocations it mirrors; REFERENCE means ../shared/REFERENCE.md, which
// names the files and versions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "models/layer_inventory.hpp"

namespace longseq::inventory {

inline constexpr const char* L = kCategoryLayer;

struct Bytes {
  double x, q, kv, kv_replicated, lse;
  double x_fp32;  // one [T, h] in fp32 (an eager norm's upcast)
  Bytes(const LayerShape& shape, const LayerImplementation& impl) {
    const double tokens = static_cast<double>(shape.tokens);
    const double a = static_cast<double>(impl.activation_bytes);
    x = tokens * static_cast<double>(shape.hidden) * a;
    x_fp32 = tokens * static_cast<double>(shape.hidden) * 4.0;
    q = tokens * static_cast<double>(shape.q_width) * a;
    kv = tokens * static_cast<double>(shape.kv_width) * a;
    kv_replicated = kv * static_cast<double>(shape.kv_replication);
    lse = tokens * static_cast<double>(shape.num_q_heads) * 4.0;  // fp32 [b, n_q/sp, S]
  }
};

// Eager RMSNorm's saved tensors beside its output (REFERENCE §7.2): the fp32 upcast of its input
// (read by pow's backward) and the normalized value in the activation dtype (read by the weight
// multiply's backward). Trace names must outlive the trace, hence one literal set per norm.
// The fp32 rsqrt(variance + eps) [T, 1] (saved by the multiply that applies it) is the layer norms'
// third saved tensor; a q/k norm's per-head one is its own ("attention.q_norm_rstd", sized by heads).
// Gemma's norm (LayerShape::norm_scale_fp32) multiplies the fp32 normalized value by (1 + w) in fp32
// and casts after: it saves that normalized value in fp32 (for w's gradient) and the fp32 (1 + w)
// [width] (for the input's). Held to PyTorch's saved-tensor hooks on transformers' Llama, Qwen,
// Mistral and Gemma 3 layers (tests/frameworks).
struct EagerNormNames {
  const char* input_fp32;
  const char* normalized;
  const char* rstd;  // nullptr: the caller allocates it (a q/k norm's)
  const char* scale_fp32;
  const char* backward_fp32;  // its backward's fp32 temporaries (eager_norm_backward_transients)
};
inline constexpr EagerNormNames kAttentionNormSaved{"attention_norm.input_fp32", "attention_norm.normalized", "attention_norm.rstd_fp32",
                                                    "attention_norm.scale_fp32", "attention_norm.backward_fp32"};
inline constexpr EagerNormNames kPostAttentionNormSaved{"post_attention_norm.input_fp32", "post_attention_norm.normalized",
                                                        "post_attention_norm.rstd_fp32", "post_attention_norm.scale_fp32", "post_attention_norm.backward_fp32"};
inline constexpr EagerNormNames kMlpNormSaved{"mlp_norm.input_fp32", "mlp_norm.normalized", "mlp_norm.rstd_fp32", "mlp_norm.scale_fp32", "mlp_norm.backward_fp32"};
inline constexpr EagerNormNames kPostMlpNormSaved{"post_mlp_norm.input_fp32", "post_mlp_norm.normalized", "post_mlp_norm.rstd_fp32",
                                                  "post_mlp_norm.scale_fp32", "post_mlp_norm.backward_fp32"};
inline constexpr EagerNormNames kFinalNormSaved{"final_norm.input_fp32", "final_norm.normalized", "final_norm.rstd_fp32",
                                                "final_norm.scale_fp32", "final_norm.backward_fp32"};
inline constexpr EagerNormNames kQNormSaved{"attention.q_norm.input_fp32", "attention.q_norm.normalized", nullptr,
                                            "attention.q_norm.scale_fp32", "attention.q_norm.backward_fp32"};
inline constexpr EagerNormNames kKNormSaved{"attention.k_norm.input_fp32", "attention.k_norm.normalized", nullptr,
                                            "attention.k_norm.scale_fp32", "attention.k_norm.backward_fp32"};

// What a frozen base does not save (LoRA and QLoRA freeze every base parameter, Reference §12 items
// 11-12): a linear saves its input for its weight's gradient alone, so a frozen nn.Linear (LoRA's
// bf16 base) saves none, while bitsandbytes' 4-bit matmul saves it whenever the input needs a
// gradient (QLoRA); a norm's weight multiply saves the normalized value for the weight's gradient
// alone. Held to PyTorch's hooks on PEFT's adapters (tests/frameworks).
inline bool base_linears_save_input(const LayerShape& shape) { return shape.lora_rank == 0 || shape.qlora; }
// A LoRA adapter on down_proj that casts its input to fp32 (PEFT's _cast_input_dtype to fp32
// adapters; QLoRA's are TRL's bf16): priced in the MLP's forward, where the product exists.
inline bool lora_adapts_down_proj_input_fp32(const LayerShape& shape) {
  return shape.lora_rank > 0 && shape.lora_all_linear && !shape.qlora;
}

// A weight gradient backward leaves in param.grad (LayerWeightGradients): never freed in the layer.
inline void weight_gradient_alloc(TensorTrace& trace, const char* name, double bytes) {
  if (bytes > 0) trace.alloc(kCategoryModelStates, name, bytes);
}
inline bool norm_weights_trained(const LayerShape& shape) { return shape.lora_rank == 0; }

// `normalized_bytes`: the norm's output size in the activation dtype; its rows are shape.tokens.
// `normalized_bytes`: the norm's output in the activation dtype; `width`: the elements it normalizes
// over (h, or d for a q/k norm), the size of Gemma's (1 + w).
inline void eager_norm_saved_alloc(TensorTrace& trace, const char* category, const EagerNormNames& names, double normalized_bytes,
                                   int64_t width, const LayerShape& shape, const LayerImplementation& impl) {
  if (!impl.eager_rms_norm) return;
  const double fp32_bytes = normalized_bytes / static_cast<double>(impl.activation_bytes) * 4.0;
  trace.alloc(category, names.input_fp32, fp32_bytes);
  if (names.rstd) trace.alloc(category, names.rstd, static_cast<double>(shape.tokens) * 4.0);
  if (shape.norm_scale_fp32) trace.alloc(category, names.scale_fp32, static_cast<double>(width) * 4.0);
  if (norm_weights_trained(shape)) trace.alloc(category, names.normalized, shape.norm_scale_fp32 ? fp32_bytes : normalized_bytes);
}
inline void eager_norm_saved_free(TensorTrace& trace, const EagerNormNames& names, const LayerShape& shape, const LayerImplementation& impl) {
  if (!impl.eager_rms_norm) return;
  if (norm_weights_trained(shape)) trace.free(names.normalized);
  if (shape.norm_scale_fp32) trace.free(names.scale_fp32);
  if (names.rstd) trace.free(names.rstd);
  trace.free(names.input_fp32);
}

// An eager norm's backward, autograd over its decomposed ops (PyTorch's derivatives.yaml): at its
// peak, pow's backward (grad * 2 * x32.pow(1)), four fp32 tensors of the input's size are live
// beside what the norm saved: the mean's expanded gradient (grad / width), the power, its scaling
// and their product. Counted from the storages PyTorch holds there (Gemma 3's post-feedforward
// norm on the CPU, tests/frameworks/test_step_peak.py); they die before the input gradient is
// cast back to the activation dtype.
inline void eager_norm_backward_transients(TensorTrace& trace, const char* category, const EagerNormNames& names, double fp32_bytes,
                                           const LayerImplementation& impl) {
  if (!impl.eager_rms_norm) return;
  trace.alloc(category, names.backward_fp32, 4.0 * fp32_bytes, 4);
  trace.free(names.backward_fp32);
}

// Rows the attention kernel's backward pads its fp32 dq accumulator and softmax_d by: FA2 varlen
// per sequence (the profile's rows), FA3 round_up(total_q + b * 64, 64) (hopper/flash_api.cpp).
inline double attention_backward_pad_rows(const LayerShape& shape, const LayerImplementation& impl) {
  const int64_t sequences = std::max<int64_t>(shape.sequences, 1);
  if (impl.flash_attention_3) {
    const int64_t rows = shape.tokens * shape.sp;  // the kernel's total_q: b * S / ring after the all-to-all
    return static_cast<double>((rows + 64 * sequences + 63) / 64 * 64 - rows);
  }
  return static_cast<double>(impl.flash_attention_varlen_pad_rows * sequences);
}

// Qwen3's q_norm/k_norm (RMSNorm over head_dim before RoPE) keep for backward: fp32 rstd per head
// and, under Liger, their inputs (the q/k projections); eager, the fp32 upcast and the normalized
// value instead (REFERENCE §7.2, modeling_qwen3.py Qwen3Attention.forward).
inline void qk_norm_saved_free(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  if (!shape.qk_norm) return;
  trace.free("attention.q_norm_rstd");
  trace.free("attention.k_norm_rstd");
  if (impl.eager_rms_norm) {
    eager_norm_saved_free(trace, kQNormSaved, shape, impl);
    eager_norm_saved_free(trace, kKNormSaved, shape, impl);
  } else {
    trace.free("attention.q_proj");
    trace.free("attention.k_proj");
  }
}

// One Ulysses all-to-all of `input` into a new tensor `output` of the same size (DS
// ulysses_sp.py _DimZeroAllToAll, REFERENCE §3.1): the send side is a rearranged .contiguous()
// copy, the receive side torch.empty_like; the result is laid out by one more .contiguous()
// while the receive buffer is still referenced. Without sequence parallelism there is no
// all-to-all and the output is a view of the input.
inline void ulysses_all_to_all(TensorTrace& trace, const char* input, const char* output, double bytes,
                        const LayerShape& shape, const LayerImplementation& impl) {
  if (shape.sp == 1) {
    trace.alias(input, L, output);
    return;
  }
  for (int64_t copy = 0; copy < impl.ulysses_staging_copies; ++copy) trace.alloc(L, "ulysses.staging", bytes);
  // The send copy dies when the collective returns; the last staging buffer lives until the
  // output layout copy exists.
  for (int64_t copy = 1; copy < impl.ulysses_staging_copies; ++copy) trace.free("ulysses.staging");
  trace.alloc(L, output, bytes);
  if (impl.ulysses_staging_copies > 0) trace.free("ulysses.staging");
}

// The outputs of projections that read the same input: one tensor each, or (Phi-3's fused
// projections) slices of one output named `fused`, whose storage lives while any slice does.
inline void projections_alloc(TensorTrace& trace, const LayerShape& shape, const char* fused,
                       std::initializer_list<std::pair<const char*, double>> outputs) {
  if (!shape.fused_projections) {
    for (const auto& [name, bytes] : outputs) trace.alloc(L, name, bytes);
    return;
  }
  double total = 0;
  for (const auto& output : outputs) total += output.second;
  trace.alloc(L, fused, total);
  for (const auto& output : outputs) trace.alias(fused, L, output.first);
  trace.free(fused);
}

// LoRA's tensors beside a frozen linear group's (Reference §12 items 9-10, 20-22), under bf16
// autocast. Per adapted linear of input width `in`: lora_A saves its input in bf16, made from an
// fp32 copy (the cast to the adapter's fp32 dtype, then autocast's cast back; the fp32 copy is
// transient), and lora_B saves the r-wide intermediate. On a 4-bit base (QLoRA) the input is not
// cast (autocast on: no conversion), each 4-bit linear clones its result (transient) and
// dequantizes its weight into a [out, in] compute-dtype buffer for the matmul, one at a time.
// One adapted linear's saved tensors, by the trace names of its base linear (literals: trace names
// must outlive the trace).
struct LoraNames {
  const char* input;   // lora_A's input (bf16)
  const char* rank;    // lora_B's input, the r-wide intermediate
  const char* a_cast;  // autocast's bf16 copy of A, saved for lora_A's input gradient
  const char* b_cast;  // and of B, for lora_B's
};
constexpr LoraNames kLoraQ{"lora.q_proj.input", "lora.q_proj.rank", "lora.q_proj.A_bf16", "lora.q_proj.B_bf16"};
constexpr LoraNames kLoraK{"lora.k_proj.input", "lora.k_proj.rank", "lora.k_proj.A_bf16", "lora.k_proj.B_bf16"};
constexpr LoraNames kLoraV{"lora.v_proj.input", "lora.v_proj.rank", "lora.v_proj.A_bf16", "lora.v_proj.B_bf16"};
constexpr LoraNames kLoraO{"lora.o_proj.input", "lora.o_proj.rank", "lora.o_proj.A_bf16", "lora.o_proj.B_bf16"};
constexpr LoraNames kLoraGate{"lora.gate_proj.input", "lora.gate_proj.rank", "lora.gate_proj.A_bf16", "lora.gate_proj.B_bf16"};
constexpr LoraNames kLoraUp{"lora.up_proj.input", "lora.up_proj.rank", "lora.up_proj.A_bf16", "lora.up_proj.B_bf16"};
constexpr LoraNames kLoraDown{"lora.down_proj.input", "lora.down_proj.rank", "lora.down_proj.A_bf16", "lora.down_proj.B_bf16"};

struct LoraLinear {
  LoraNames names;
  double input_bytes = 0, rank_bytes = 0, a_cast_bytes = 0, b_cast_bytes = 0;  // saved (0: not saved)
};

struct LoraGroup {
  std::vector<LoraLinear> adapted;
  double largest_input_fp32 = 0;              // transient cast copy
  double largest_output = 0, largest_weight = 0;  // QLoRA's clone and dequantized weight
};

struct LoraSite {
  LoraNames names;
  int64_t in, out;
  bool default_target;  // adapted by PEFT's default targets (q_proj, v_proj)
};

// The blocks, each in its file (same names as executor/step/): mlp.cpp, moe.cpp, lora.cpp,
// attention.cpp, loss.cpp.
void mlp_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, double tokens, bool keep);
void mlp_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, double tokens,
                  const char* input_grad_name);
double mlp_tile_tokens(const LayerShape& shape);
LayerShape moe_tile_shape(const LayerShape& shape);
void mlp_tile_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep);
void moe_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep);
void moe_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, const char* input_grad_name);
LoraGroup lora_attention_projections(const LayerShape& shape, const LayerImplementation& impl);
LoraGroup lora_output_projection(const LayerShape& shape, const LayerImplementation& impl);
LoraGroup lora_mlp(const LayerShape& shape, const LayerImplementation& impl);
void lora_forward(TensorTrace& trace, const LayerShape& shape, const LoraGroup& group, bool keep);
void lora_backward(TensorTrace& trace, const LayerShape& shape, const LoraGroup& group);
void ulysses_attention_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep);
void ulysses_attention_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);
void fpdt_attention_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep);
void fpdt_attention_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);

// Megatron-Core's TE layer and vocabulary-parallel loss (megatron.cpp), in place of the Hugging Face
// layer's and loss's schedules where LayerImplementation::megatron_te_layer says so; the same
// contracts as decoder_layer_forward/backward, decoder_layer_saved_bytes and lm_loss_forward_backward.
void megatron_layer_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep);
void megatron_layer_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);
double megatron_layer_saved_bytes(const LayerShape& shape, const LayerImplementation& impl);
void megatron_loss_forward_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);
// Megatron's column- and row-parallel linears under sequence parallelism (megatron.cpp, M1.1-M1.2),
// which its layer and its MoE layer's shared experts share: the input gathered over the TP ranks
// around a column-parallel GEMM ("tp.gathered_input"), a row-parallel GEMM's partial sums
// reduce-scattered into `output` (its storage id returned), and a column-parallel linear's input
// gradient reduce-scattered from `partial` into `shard` (renamed, without TP).
void column_parallel_gather(TensorTrace& trace, const LayerShape& shape, double gathered_bytes, std::string_view category = L);
void column_parallel_gather_free(TensorTrace& trace, const LayerShape& shape);
int64_t row_parallel_reduce_scatter(TensorTrace& trace, const LayerShape& shape, double gathered_bytes, double shard_bytes, const char* output);
void input_gradient_to_shard(TensorTrace& trace, const LayerShape& shape, double shard_bytes, std::string_view category, const char* partial,
                             const char* shard);
// A column-parallel linear's whole backward: the input gathered again for the weight gradient beside
// the input gradient `partial` made from `output_grad` (freed), then reduced to `shard`.
void column_parallel_backward(TensorTrace& trace, const LayerShape& shape, double gathered_bytes, double shard_bytes, const char* output_grad,
                              const char* partial, const char* shard);
// Transformer Engine's FP8 tensors around its linears (LayerImplementation::te_fp8, M10.1), which
// Megatron's layer and its MoE layer share; each placement is nothing where `on` is false (bf16).
// A tensor is quantized to a byte an element (`one`), twice over where a GEMM reads it both ways on a
// card that keeps a transposed copy beside the row-wise one (`both`).
struct TeFp8 {
  bool on;
  double activation_bytes, copies;
  explicit TeFp8(const LayerImplementation& impl)
      : on(impl.te_fp8), activation_bytes(static_cast<double>(impl.activation_bytes)), copies(impl.te_fp8_transposed_copies ? 2.0 : 1.0) {}
  double one(double bf16_bytes) const { return bf16_bytes / activation_bytes; }
  double both(double bf16_bytes) const { return one(bf16_bytes) * copies; }
  // The row-wise copy a GEMM reads of its input (`input_bytes` at the activation dtype) beside the
  // column-wise one the linear saves, until the GEMM has run: where the card keeps transposed copies
  // and the input is not `gathered` over TP (a gathered input is row-wise only, gathered in FP8).
  void rowwise_copy_alloc(TensorTrace& trace, double input_bytes, bool gathered) const;
  void rowwise_copy_free(TensorTrace& trace, bool gathered) const;
  // A linear that quantizes its own input: the copy it saves, `saved`, and the GEMM's row-wise one.
  void input_quantize(TensorTrace& trace, const char* saved, double input_bytes, bool gathered) const;
  // A backward's output gradient (`grad_bytes` at the activation dtype) quantized for both its GEMMs,
  // held until they have run ("fp8.output_grad").
  void output_grad_quantize(TensorTrace& trace, double grad_bytes) const;
  void output_grad_free(TensorTrace& trace) const;
};
// A row-parallel linear's output gradient as its backward GEMMs read it: gathered over the TP ranks
// (M1.2), in FP8 quantized for both GEMMs, gathered so, with or without TP (TE linear.py L1240-1262).
void row_parallel_output_grad(TensorTrace& trace, const LayerShape& shape, const TeFp8& fp8, double gathered_bytes);
void row_parallel_output_grad_free(TensorTrace& trace, const LayerShape& shape, const TeFp8& fp8);
// Megatron's multi-head latent attention before the core attention (megatron_mla.cpp): forward
// expects "layer.input" live and leaves "attention.q", "attention.k" and "attention.v" (and with
// `keep` what its backward reads); backward takes "attention.dqkv" and leaves "layer.input_grad".
void megatron_mla_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep);
void megatron_mla_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);
// Selective recompute's rerun of MLA's up-projections and RoPE in backward (recompute_modules
// "mla_up_proj"): leaves q, k and v live again, the up-projections' outputs freed.
void megatron_mla_up_projection_recompute(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);
// Megatron's MoE layer (megatron_moe.cpp) in place of the layer's MLP: forward expects
// "residual.attention" live and leaves "layer.output"; backward leaves "residual.attention_grad".
void megatron_moe_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep);
void megatron_moe_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);

}  // namespace longseq::inventory
