// The decoder-layer inventory replayed into a TensorTrace, checked against peaks derived by hand.
//
// Shape used throughout (per rank): T = 1000 tokens, h = 64, n_q = 8, n_kv = 2, d = 8,
// f = 128, V = 512, bf16 (a = 2). Per-tensor bytes:
//   X = T*h*a = 128,000   Q = T*n_q*d*a = 128,000   K = T*n_kv*d*a = 32,000
//   F = T*f*a = 256,000   lse = T*n_q*4 = 32,000
#include <doctest/doctest.h>

#include <stdexcept>

#include "models/inventory/internal.hpp"  // the MoE block alone (moe_forward, moe_backward)
#include "models/layer_inventory.hpp"
#include "models/tensor_trace.hpp"

using namespace longseq;

namespace {

constexpr double X = 128'000, Q = 128'000, K = 32'000, F = 256'000, LSE = 32'000;

LayerShape shape_make(int64_t sp = 1, int64_t mlp_tiles = 0) {
  LayerShape shape;
  shape.tokens = 1000;
  shape.sp = sp;
  shape.hidden = 64;
  shape.q_width = 64;
  shape.kv_width = 16;
  shape.kv_replication = sp > 2 ? sp / 2 : 1;
  shape.num_q_heads = 8;
  shape.intermediate = 128;
  shape.vocab = 512;
  shape.mlp_tiles = mlp_tiles;
  return shape;
}

LayerImplementation eager() {
  LayerImplementation impl;
  impl.activation_bytes = 2;
  impl.ulysses_staging_copies = 2;
  return impl;
}

// One decoder layer's recompute and backward on a trace: its input (back from the checkpoint) and
// the gradient arriving from above, the forward that keeps what backward needs, then the backward.
TensorTrace layer_step_trace(const LayerShape& shape, const LayerImplementation& impl) {
  TensorTrace trace;
  trace.alloc(kCategoryLayer, "layer.input", X);
  trace.alloc(kCategoryLayer, "layer.output_grad", X);
  decoder_layer_forward(trace, shape, impl, true);
  decoder_layer_backward(trace, shape, impl);
  return trace;
}

// A kept forward, then backward from the output's gradient: only the input's gradient is left.
void check_backward_leaves_input_grad_alone(const LayerShape& shape, const LayerImplementation& impl) {
  TensorTrace trace;
  trace.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(trace, shape, impl, true);
  trace.alloc(kCategoryLayer, "layer.output_grad", X);
  decoder_layer_backward(trace, shape, impl);
  REQUIRE(trace.live_items().size() == 1);
  CHECK(trace.live_items()[0].name == "layer.input_grad");
}

double live_bytes_of_peak(const TensorTrace& trace, std::string_view name) {
  for (const auto& item : trace.peak_items())
    if (item.name == name) return item.bytes;
  return -1;
}

double live_bytes_of(const TensorTrace& trace, std::string_view name) {
  for (const auto& item : trace.live_items())
    if (item.name == name) return item.bytes;
  return -1;
}

}  // namespace

TEST_CASE("trace: views share one storage, released with the last name") {
  TensorTrace trace;
  trace.alloc("c", "a", 100);
  trace.alias("a", "c", "b");
  CHECK(trace.current_bytes() == 100);
  trace.free("a");
  CHECK(trace.current_bytes() == 100);  // b still views it
  CHECK(live_bytes_of(trace, "b") == 100);
  trace.free("b");
  CHECK(trace.current_bytes() == 0);
  CHECK(trace.peak_bytes() == 100);
  CHECK_THROWS_AS(trace.free("b"), std::logic_error);
}

TEST_CASE("forward without keeping (checkpointed layer): peak is at the eager SwiGLU") {
  TensorTrace trace;
  trace.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(trace, shape_make(), eager(), /*keep=*/false);
  // Attention moment: input, norm out, q (+view), k, v, attention out, lse = 2X + 2Q + 2K + lse = 608,000.
  // MLP moment: input, residual, mlp norm out, gate, up, SiLU(gate), product = 3X + 4F = 1,408,000.
  CHECK(trace.peak_bytes() == 3 * X + 4 * F);
  CHECK(trace.peak_moment() == "mlp");
  // Only the input and output remain.
  CHECK(trace.current_bytes() == 2 * X);
  CHECK(trace.live_items().size() == 2);
}

TEST_CASE("forward: Liger's fused SwiGLU saves one F, TiledMLP leaves one tile's F") {
  LayerImplementation fused = eager();
  fused.fused_swiglu = true;
  TensorTrace trace;
  trace.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(trace, shape_make(), fused, false);
  CHECK(trace.peak_bytes() == 3 * X + 3 * F);

  // 4 tiles of 250 tokens: input, residual, mlp norm out, tile outputs X, one tile's
  // gate/up/SiLU/product (F/4 each) = 4X + F = 768,000; attention's 608,000 is lower.
  TensorTrace tiled;
  tiled.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(tiled, shape_make(1, 4), eager(), false);
  CHECK(tiled.peak_bytes() == 4 * X + F);
}

TEST_CASE("recompute + backward of one layer, sp = 1, untiled eager SwiGLU") {
  TensorTrace trace;
  trace.alloc(kCategoryLayer, "layer.input", X);
  trace.alloc(kCategoryLayer, "layer.output_grad", X);
  decoder_layer_forward(trace, shape_make(), eager(), /*keep=*/true);
  // Saved for backward: norm out X, q Q, k K, v K, attention out Q (o_proj's input is a view
  // of it without an all-to-all), lse, residual X, mlp norm out X, gate/up/SiLU/product 4F,
  // plus input, incoming gradient and output: 6X + 2Q + 2K + lse + 4F.
  CHECK(trace.current_bytes() == 6 * X + 2 * Q + 2 * K + LSE + 4 * F);
  CHECK(decoder_layer_saved_bytes(shape_make(), eager()) == 5 * X + 2 * Q + 2 * K + LSE + 4 * F - X);
  decoder_layer_backward(trace, shape_make(), eager());
  // MLP backward peak: product freed after its gradient, then d(SiLU) and d(up) join:
  // gate, up, SiLU, d(product), d(SiLU), d(up) = 6F on top of 6X + 2Q + 2K + lse.
  CHECK(trace.peak_bytes() == 6 * X + 2 * Q + 2 * K + LSE + 6 * F);
  CHECK(trace.peak_moment() == "mlp");
  // Everything is freed except the input gradient.
  CHECK(trace.current_bytes() == X);
  REQUIRE(trace.live_items().size() == 1);
  CHECK(trace.live_items()[0].name == "layer.input_grad");
}

TEST_CASE("attention backward with FlashAttention-2's buffers, sp = 1, tiled MLP") {
  LayerImplementation fa2 = eager();
  fa2.flash_attention_dq_accumulator = true;
  fa2.flash_attention_expands_gqa_grads = true;
  const TensorTrace trace = layer_step_trace(shape_make(1, 1000), fa2);
  // At FlashAttention backward: input, incoming grad, layer output, norm out, residual grad
  // (5X); q, attention out, output grad, dq (4Q); k, v, dk, dv (4K); lse; dk and dv expanded
  // to q heads (2Q); the fp32 dq accumulator (2Q); softmax_d (lse).
  CHECK(trace.peak_bytes() == 5 * X + 8 * Q + 4 * K + 2 * LSE);
  CHECK(trace.peak_moment() == "attention");
}

TEST_CASE("attention backward with FlashAttention-3's buffers: fp32 dk/dv accumulators at kv width, no expansion, two fp32 row statistics") {
  LayerImplementation fa3 = eager();
  fa3.flash_attention_3 = true;
  const TensorTrace trace = layer_step_trace(shape_make(1, 1000), fa3);
  // As FA2's moment (5X; q, out, output grad, dq: 4Q; k, v, dk, dv: 4K; lse) but with fp32 dk/dv
  // accumulators at kv width (2 x 2K) instead of bf16 expanded ones at q width (2Q), the fp32 dq
  // accumulator (2Q), softmax_d and softmax_lse_log2 (2 lse): 2Q - 4K = 128,000 bytes less here.
  // FA3 pads those three to round_up(total_q + 64 b, 64) rows: round_up(1064, 64) - 1000 = 88 rows
  // of fp32 dq (n_q d = 64 values: 256 B) and of two fp32 statistics (n_q = 8 values: 32 B each).
  const double fa3_padding = 88 * 256 + 2 * 88 * 32;
  CHECK(trace.peak_bytes() == 5 * X + 6 * Q + 8 * K + 3 * LSE + fa3_padding);
  CHECK(trace.peak_moment() == "attention");
  // Without GQA (n_kv = n_q) FA3 has no dk/dv accumulators.
  LayerShape mha = shape_make(1, 1000);
  mha.kv_width = mha.q_width;
  TensorTrace full;
  full.alloc(kCategoryLayer, "layer.input", X);
  full.alloc(kCategoryLayer, "layer.output_grad", X);
  decoder_layer_forward(full, mha, fa3, true);
  decoder_layer_backward(full, mha, fa3);
  CHECK(full.peak_bytes() == 5 * X + 6 * Q + 4 * Q + 3 * LSE + fa3_padding);
}

TEST_CASE("FlashAttention-2 varlen pads dq_accum and softmax_d by 128 rows per sequence") {
  LayerImplementation fa2 = eager();
  fa2.flash_attention_dq_accumulator = true;
  fa2.flash_attention_expands_gqa_grads = true;
  auto peak = [&](int64_t pad_rows, int64_t sequences) {
    LayerImplementation impl = fa2;
    impl.flash_attention_varlen_pad_rows = pad_rows;
    LayerShape shape = shape_make(1, 1000);
    shape.sequences = sequences;
    return layer_step_trace(shape, impl).peak_bytes();
  };
  // 128 rows per sequence of fp32 dq (64 values: 256 B) and fp32 softmax_d (8 values: 32 B).
  CHECK(peak(128, 1) - peak(0, 1) == 128 * (256 + 32));
  CHECK(peak(128, 3) - peak(0, 3) == 3 * 128 * (256 + 32));
}

TEST_CASE("eager RMSNorm saves its fp32 upcast, its rsqrt and its normalized value, not its input (as PyTorch's hooks record)") {
  LayerImplementation fa2 = eager();
  fa2.flash_attention_dq_accumulator = true;
  fa2.flash_attention_expands_gqa_grads = true;
  LayerImplementation eager_norm = fa2;
  eager_norm.eager_rms_norm = true;
  auto run = [&](const LayerImplementation& impl, bool keep) {
    TensorTrace trace;
    trace.alloc(kCategoryLayer, "layer.input", X);
    trace.alloc(kCategoryLayer, "layer.output_grad", X);
    decoder_layer_forward(trace, shape_make(1, 1000), impl, keep);
    if (keep) decoder_layer_backward(trace, shape_make(1, 1000), impl);
    return trace;
  };
  // Recompute forward (keep): both norms' saved tensors stay, 2 x (fp32 2X + X + fp32 rsqrt T x 4 B)
  // = 6X + 8 kB, until the backward frees each at its norm; the residual between them is no longer
  // kept (the MLP norm saves its fp32 copy, the add nothing: tests/frameworks holds this list to
  // transformers' Llama layer). The layer ends as without them.
  constexpr double RSTD = 1000 * 4.0;
  TensorTrace forward_kept;
  forward_kept.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(forward_kept, shape_make(1, 1000), eager_norm, true);
  TensorTrace forward_plain;
  forward_plain.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(forward_plain, shape_make(1, 1000), fa2, true);
  CHECK(forward_kept.current_bytes() - forward_plain.current_bytes() == 6 * X + 2 * RSTD - X);
  CHECK(live_bytes_of(forward_kept, "attention_norm.input_fp32") == 2 * X);
  CHECK(live_bytes_of(forward_kept, "attention_norm.rstd_fp32") == RSTD);
  CHECK(live_bytes_of(forward_kept, "mlp_norm.normalized") == X);
  CHECK(live_bytes_of(forward_kept, "residual.attention") == -1);
  CHECK(decoder_layer_saved_bytes(shape_make(1, 1000), eager_norm) == decoder_layer_saved_bytes(shape_make(1, 1000), fa2) + 6 * X + 2 * RSTD - 2 * X);
  const TensorTrace backward = run(eager_norm, true);
  CHECK(backward.current_bytes() == run(fa2, true).current_bytes());
  // At FlashAttention's backward only the attention norm's 3X and rsqrt remain (the MLP norm's went
  // at its backward, and the residual with it): the same moment is 3X + rsqrt - X higher.
  CHECK(backward.peak_bytes() >= run(fa2, true).peak_bytes() + 2 * X + RSTD);
  // Under no_grad (checkpointed forward) nothing is saved.
  TensorTrace no_grad;
  no_grad.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(no_grad, shape_make(1, 1000), eager_norm, false);
  CHECK(live_bytes_of(no_grad, "attention_norm.input_fp32") == -1);
}

TEST_CASE("Qwen3's q/k norms keep the projections and fp32 statistics per head until attention backward") {
  LayerImplementation fa2 = eager();
  LayerShape shape = shape_make(1, 1000);
  LayerShape qwen = shape;
  qwen.qk_norm = true;
  qwen.num_kv_heads = 2;
  auto forward = [&](const LayerShape& s, const LayerImplementation& impl) {
    TensorTrace trace;
    trace.alloc(kCategoryLayer, "layer.input", X);
    decoder_layer_forward(trace, s, impl, true);
    return trace;
  };
  // Liger's norm saves its input: q_proj (Q) and k_proj (K), with rstd [T, n_q] and [T, n_kv] fp32:
  // Q + K + LSE + T * 2 * 4 = 128,000 + 32,000 + 32,000 + 8,000 (REFERENCE 7.2: (q + kv width)/h X).
  const TensorTrace plain = forward(shape, fa2);
  const TensorTrace liger = forward(qwen, fa2);
  CHECK(liger.current_bytes() - plain.current_bytes() == Q + K + LSE + 8000);
  CHECK(live_bytes_of(liger, "attention.q_proj") == Q);
  CHECK(live_bytes_of(liger, "attention.k_norm_rstd") == 8000);
  // Eager: the fp32 upcast and the normalized value instead of the projection (3Q + 3K) beside the
  // statistics, and the layer's two norms' 6X.
  LayerImplementation eager_norm = fa2;
  eager_norm.eager_rms_norm = true;
  CHECK(forward(qwen, eager_norm).current_bytes() - forward(shape, eager_norm).current_bytes() == 3 * Q + 3 * K + LSE + 8000);
  // Backward frees all of it.
  for (const LayerImplementation& impl : {fa2, eager_norm}) check_backward_leaves_input_grad_alone(qwen, impl);
}

TEST_CASE("Gemma's four norms: an eager norm saves its normalized value in fp32 and (1 + w), a fused one the block output") {
  LayerImplementation fa2 = eager();
  LayerImplementation eager_norm = fa2;
  eager_norm.eager_rms_norm = true;
  const LayerShape llama = shape_make(1, 1000);
  LayerShape gemma = llama;
  gemma.post_norms = true;
  gemma.norm_scale_fp32 = true;
  auto forward = [&](const LayerShape& s, const LayerImplementation& impl) {
    TensorTrace trace;
    trace.alloc(kCategoryLayer, "layer.input", X);
    decoder_layer_forward(trace, s, impl, true);
    return trace;
  };
  // Eager (Gemma3RMSNorm.forward): per norm the fp32 input 2X, rsqrt T x 4 B, (1 + w) h x 4 B and
  // the fp32 normalized 2X, where Llama's keeps 2X + rsqrt + X: four such norms against two.
  constexpr double RSTD = 1000 * 4.0, SCALE = 64 * 4.0;
  const double gemma_norm = 4 * X + RSTD + SCALE, llama_norm = 3 * X + RSTD;
  const TensorTrace eager_gemma = forward(gemma, eager_norm);
  CHECK(eager_gemma.current_bytes() - forward(llama, eager_norm).current_bytes() == 4 * gemma_norm - 2 * llama_norm);
  CHECK(live_bytes_of(eager_gemma, "post_attention_norm.normalized") == 2 * X);
  CHECK(live_bytes_of(eager_gemma, "post_mlp_norm.scale_fp32") == SCALE);
  CHECK(live_bytes_of(eager_gemma, "attention.o_proj_output") == -1);  // its fp32 copy is saved instead
  // A fused norm (Liger's) saves its input: o_proj's output and the MLP's, X each.
  const TensorTrace fused_gemma = forward(gemma, fa2);
  CHECK(fused_gemma.current_bytes() - forward(llama, fa2).current_bytes() == 2 * X);
  CHECK(live_bytes_of(fused_gemma, "mlp.output") == X);
  // Frozen weights (LoRA): no normalized value is saved, (1 + w) still is (the input needs its gradient).
  LayerShape gemma_lora = gemma, llama_lora = llama;
  gemma_lora.lora_rank = llama_lora.lora_rank = 4;
  CHECK(forward(gemma_lora, eager_norm).current_bytes() - forward(llama_lora, eager_norm).current_bytes() ==
        4 * (2 * X + RSTD + SCALE) - 2 * (2 * X + RSTD));
  // Backward frees all of it, and each post norm's input gradient is held one block at most.
  for (const LayerImplementation& impl : {fa2, eager_norm}) check_backward_leaves_input_grad_alone(gemma, impl);
  // Under no_grad (a checkpointed forward) nothing of the post norms stays.
  TensorTrace no_grad;
  no_grad.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(no_grad, gemma, eager_norm, false);
  CHECK(live_bytes_of(no_grad, "post_attention_norm.input_fp32") == -1);
  CHECK(live_bytes_of(no_grad, "mlp.post_norm_output") == -1);
}

TEST_CASE("ZeRO-3 holds every TiledMLP shard's weight gradients through the MLP backward") {
  // An MLP-heavy shape (f = 4096) so that the peak falls in a tile's backward.
  LayerShape shape = shape_make(1, 2);
  shape.intermediate = 4096;
  LayerImplementation impl = eager();
  auto peak = [&](double held) {
    LayerImplementation with = impl;
    with.mlp_tile_weight_grads_bytes = held;
    const TensorTrace trace = layer_step_trace(shape, with);
    CHECK(std::string(trace.peak_moment()) == "mlp");
    return trace.peak_bytes();
  };
  const double gate_up_down = 3.0 * 64 * 4096 * 2;  // 3 h f bf16
  CHECK(peak(gate_up_down) - peak(0) == gate_up_down);
}

TEST_CASE("Ulysses: all-to-all staging, and kv heads replicated when sp > n_kv") {
  // sp = 4 > n_kv = 2: k and v are repeated r = 2 times before their all-to-all.
  const LayerShape shape = shape_make(4);
  TensorTrace trace;
  trace.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(trace, shape, eager(), true);
  CHECK(live_bytes_of(trace, "attention.k") == 2 * K);  // T * (n_kv * r) * d * a = T * sp * d * a
  CHECK(live_bytes_of(trace, "attention.v") == 2 * K);
  CHECK(live_bytes_of(trace, "attention.q") == Q);
  CHECK(live_bytes_of(trace, "attention.output_local") == Q);  // a separate buffer after the all-to-all
  CHECK_FALSE(trace.is_live("ulysses.staging"));

  // sp = 2 divides n_kv: no replication.
  TensorTrace plain;
  plain.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(plain, shape_make(2), eager(), true);
  CHECK(live_bytes_of(plain, "attention.k") == K);
}

TEST_CASE("logits and loss: untiled peaks in cross-entropy backward, Liger holds one chunk") {
  TensorTrace untiled;
  untiled.alloc(kCategoryLayer, "final_norm.input", X);
  lm_loss_forward_backward(untiled, shape_make(), eager(), LossImplementation::loss_untiled, 0, 2);
  // Forward: final norm in/out 2X + logits (2) + fp32 upcast (4) + log-softmax (4) = 10 bytes per
  // logit, plus the per-token loss 4T. Backward: log-softmax output + nll gradient + log-softmax
  // gradient = 12 bytes per logit, plus 4T: the peak.
  CHECK(untiled.peak_bytes() == 2 * X + 1000.0 * 512 * 12 + 4000);
  CHECK(untiled.peak_moment() == "cross entropy backward");
  CHECK(untiled.current_bytes() == X);  // the gradient into the last layer
  CHECK(untiled.is_live("layer.output_grad"));

  TensorTrace liger;
  liger.alloc(kCategoryLayer, "final_norm.input", X);
  lm_loss_forward_backward(liger, shape_make(), eager(), LossImplementation::loss_liger_chunked, 128, 2);
  // 3X (in, out, grad_input) + grad_weight V*h*2 + loss_1d 4T + chunk logits 128*V*2 + chunk input grad 128*h*2.
  CHECK(liger.peak_bytes() == 3 * X + 512.0 * 64 * 2 + 4000 + 128.0 * 512 * 2 + 128.0 * 64 * 2);

  TensorTrace shards;
  shards.alloc(kCategoryLayer, "final_norm.input", X);
  lm_loss_forward_backward(shards, shape_make(), eager(), LossImplementation::loss_token_shards, 250, 2);
  // 3X + one 250-token shard of the untiled loss at its backward peak (12 bytes per logit + 4T).
  CHECK(shards.peak_bytes() == 3 * X + 250.0 * 512 * 12 + 1000);
}

TEST_CASE("soft-capped logits (Gemma 2): tanh's saved output sits under the untiled loss's peak, and a tiled loss caps nothing") {
  LayerShape capped_shape = shape_make();
  capped_shape.final_logits_softcapped = true;
  TensorTrace capped;
  capped.alloc(kCategoryLayer, "final_norm.input", X);
  lm_loss_forward_backward(capped, capped_shape, eager(), LossImplementation::loss_untiled, 0, 2);
  // The untiled peak above plus tanh's output (bf16 [T, V], saved until tanh's backward), which
  // outlives the capped logits' fp32 copy; the other two [T, V] of the cap die as the next is made.
  CHECK(capped.peak_bytes() == 2 * X + 1000.0 * 512 * 12 + 4000 + 1000.0 * 512 * 2);
  CHECK(capped.peak_moment() == "cross entropy backward");
  CHECK(capped.current_bytes() == X);
  CHECK_FALSE(capped.is_live("loss.softcap_tanh"));

  TensorTrace shards;
  shards.alloc(kCategoryLayer, "final_norm.input", X);
  lm_loss_forward_backward(shards, capped_shape, eager(), LossImplementation::loss_token_shards, 250, 2);
  CHECK(shards.peak_bytes() == 3 * X + 250.0 * 512 * 12 + 1000);
}

namespace {

// The MoE block on the same shape: E = 8 experts of width I_e = 32, k = 2 a token. Per rank:
//   pairs (T*k = 2000 token-expert pairs): [2000, h] = 256,000 B, [2000, I_e] = 128,000 B
//   one expert's share (balanced): 32,000 B and 16,000 B
//   router probs fp32 T*E*4 = 32,000; top-k weights fp32 T*k*4 = 8,000, indices int64 T*k*8 =
//   16,000, weights cast to bf16 T*k*2 = 4,000; one_hot int64 T*k*E*8 = 128,000
constexpr double PAIRS_X = 256'000, PAIRS_F = 128'000, EXPERT_X = 32'000, EXPERT_F = 16'000;
constexpr double ROUTING_SAVED = 32'000 + 8'000 + 16'000 + 4'000, ONE_HOT = 128'000;

LayerShape moe_shape(int64_t shared_intermediate = 0) {
  LayerShape shape = shape_make();
  shape.experts = 8;
  shape.experts_per_token = 2;
  shape.expert_intermediate = 32;
  shape.shared_expert_intermediate = shared_intermediate;
  shape.shared_expert_gate = shared_intermediate > 0;
  return shape;
}

LayerImplementation grouped() {
  LayerImplementation impl = eager();
  impl.moe_experts = MoeExperts::moe_grouped_gemm;
  return impl;
}

}  // namespace

TEST_CASE("MoE block saves the router's fp32 probabilities, the routing and T*k*(2h + 4 I_e) of expert tensors") {
  // Reference §12 4.9: saved = T*k*(2h + 4I)*a + routing; here 2000 * (128 + 128) * 2 = 1,024,000.
  const double moe_saved = ROUTING_SAVED + 2 * PAIRS_X + 4 * PAIRS_F;
  CHECK(moe_saved == 1'084'000);
  const double dense_saved = decoder_layer_saved_bytes(shape_make(), eager());
  CHECK(decoder_layer_saved_bytes(moe_shape(), eager()) == dense_saved - 4 * F + moe_saved);
  // The grouped GEMM saves the same tensors (its transients differ).
  CHECK(decoder_layer_saved_bytes(moe_shape(), grouped()) == dense_saved - 4 * F + moe_saved);
  // A shared expert of width 64 (Qwen2-MoE): its gate, up, SiLU, product ([T, 64] bf16 = 128,000
  // each), its output X and the sigmoid gate [T, 1] (2,000).
  CHECK(decoder_layer_saved_bytes(moe_shape(64), eager()) == dense_saved - 4 * F + moe_saved + 4 * 128'000 + X + 2'000);
}

TEST_CASE("MoE forward without keeping: the expert loop holds one expert at a time, the grouped GEMM every pair") {
  // Live at the experts: input, residual, mlp norm out, the block's output (3X + X), the routing
  // (kept until the block returns), the one_hot mask, and the experts' working set: one expert's
  // gathered input, gate, up, SiLU, product, output and weighted output in the loop.
  TensorTrace loop;
  loop.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(loop, moe_shape(), eager(), false);
  CHECK(loop.peak_bytes() == 4 * X + ROUTING_SAVED + ONE_HOT + 3 * EXPERT_X + 4 * EXPERT_F);
  CHECK(loop.peak_moment() == "moe experts");
  CHECK(loop.current_bytes() == 2 * X);  // input and output: nothing of the block stays
  TensorTrace all_pairs;
  all_pairs.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(all_pairs, moe_shape(), grouped(), false);
  CHECK(all_pairs.peak_bytes() == 4 * X + ROUTING_SAVED + ONE_HOT + 3 * PAIRS_X + 4 * PAIRS_F);
  CHECK(all_pairs.current_bytes() == 2 * X);
}

TEST_CASE("MoE backward: every expert's saved tensors wait while one expert (loop) or all pairs (grouped) differentiate") {
  // After the recompute: input, incoming gradient, output and the saved tensors (as the dense
  // test: 6X + 2Q + 2K + lse, with the block's saved tensors in place of the MLP's 4F), then the
  // block's input gradient X. The expert backward's largest moment: the loop's is its gathered
  // rows' gradient scattered into a zero [T, h] (X) beside one expert's input gradient; the
  // grouped GEMM's is d(up), d(gate) and two input gradients of all pairs (2 PAIRS_F + 2 PAIRS_X).
  const double before = 7 * X + 2 * Q + 2 * K + LSE + ROUTING_SAVED + 2 * PAIRS_X + 4 * PAIRS_F;
  const TensorTrace loop = layer_step_trace(moe_shape(), eager());
  CHECK(loop.peak_bytes() == before + EXPERT_X + X);
  CHECK(loop.peak_moment() == "moe experts");
  const TensorTrace all_pairs = layer_step_trace(moe_shape(), grouped());
  CHECK(all_pairs.peak_bytes() == before + 2 * PAIRS_F + 2 * PAIRS_X);
  // Everything but the input gradient is freed, with or without a shared expert.
  for (const TensorTrace& trace : {loop, all_pairs, layer_step_trace(moe_shape(64), eager())}) {
    CHECK(trace.current_bytes() == X);
    REQUIRE(trace.live_items().size() == 1);
    CHECK(trace.live_items()[0].name == "layer.input_grad");
  }
}

TEST_CASE("transformers 5's experts backward: three pair-sized gradients at the routing weights' multiply, the shared MLP's tensors waiting") {
  // moe_shape: T = 1,000, h = 64 (X = 128,000), T*k = 2,000 pairs (PAIRS_X = 256,000 in bf16).
  // After the inverse order's index backward (its int64 [T*k], 16,000, gone), MulBackward0 holds the
  // incoming gradient and both products in the gradient's dtype: bf16 from the Qwen routers, fp32
  // from Mixtral's (transformers' integrations/moe.py; PyTorch's mul_tensor_backward).
  LayerImplementation hf5 = eager();
  hf5.moe_experts = MoeExperts::moe_hf_grouped_mm;
  const auto backward_peak_above_forward = [&](const LayerShape& shape, TensorTrace& trace) {
    trace.set_record_peak_items(true);
    longseq::inventory::moe_forward(trace, shape, hf5, true);
    trace.free("mlp.output");  // handed on; its gradient comes back
    trace.alloc(kCategoryLayer, "mlp.output_grad", X);
    const double before_backward = trace.current_bytes();
    longseq::inventory::moe_backward(trace, shape, hf5, "mlp.input_grad");
    return trace.peak_bytes() - before_backward;
  };
  const auto live_at_peak = [](const TensorTrace& trace, const char* name) {
    for (const TraceItem& item : trace.peak_items())
      if (item.name == name) return true;
    return false;
  };
  TensorTrace qwen3;
  CHECK(backward_peak_above_forward(moe_shape(), qwen3) == 3 * PAIRS_X - 16'000);
  // No gradient has reached the block's input yet: the gathered pairs' backward starts it.
  CHECK_FALSE(live_at_peak(qwen3, "mlp.input_grad"));
  LayerShape mixtral_shape = moe_shape();
  mixtral_shape.moe_routing_weights_fp32 = true;
  TensorTrace mixtral;
  CHECK(backward_peak_above_forward(mixtral_shape, mixtral) == 3 * 2 * PAIRS_X - 16'000);
  // Qwen2-MoE: the shared expert's gate sends its input gradient first ([T, h]) and its output's
  // gradient waits ([T, h], replacing the saved output) with the MLP's four saved [T, I_s] for the
  // experts and the router to finish.
  TensorTrace qwen2;
  backward_peak_above_forward(moe_shape(64), qwen2);
  for (const char* name : {"mlp.input_grad", "moe.shared_output_grad", "moe.shared_gate", "moe.shared_up", "moe.shared_act",
                           "moe.shared_product", "moe.expert_output_grad_product"})
    CHECK_MESSAGE(live_at_peak(qwen2, name), name);
}

TEST_CASE("transformers 5's grouped_mm experts save the sort order, gather index, inverse order, offsets and the pairs' weights") {
  // integrations/moe.py grouped_mm_experts_forward beside the router (tests/frameworks holds the same
  // list to PyTorch's hooks): router probs fp32 32,000, top-k indices 16,000, and with renormalized
  // weights the in-place division's divisor [T, 1] fp32 (4,000) and values before it (8,000); three
  // int64 [T*k] (16,000 each), int32 offsets [E] (32), the pairs' weights [T*k] (bf16 4,000 from the
  // Qwen routers, fp32 8,000 from Mixtral's), the gathered inputs and outputs (2 PAIRS_X), gate_up
  // as one [T*k, 2 I_e] (2 PAIRS_F), SiLU and the product (2 PAIRS_F).
  LayerImplementation hf5 = eager();
  hf5.moe_experts = MoeExperts::moe_hf_grouped_mm;
  const double dense_saved = decoder_layer_saved_bytes(shape_make(), eager());
  const double experts_saved = 3 * 16'000 + 32 + 2 * PAIRS_X + 4 * PAIRS_F;
  LayerShape qwen = moe_shape();
  qwen.moe_normalize_topk = false;
  CHECK(decoder_layer_saved_bytes(qwen, hf5) == dense_saved - 4 * F + 32'000 + 16'000 + experts_saved + 4'000);
  LayerShape qwen3 = moe_shape();  // norm_topk_prob
  CHECK(decoder_layer_saved_bytes(qwen3, hf5) == dense_saved - 4 * F + 32'000 + 16'000 + 4'000 + 8'000 + experts_saved + 4'000);
  LayerShape mixtral = moe_shape();
  mixtral.moe_routing_weights_fp32 = true;
  CHECK(decoder_layer_saved_bytes(mixtral, hf5) == dense_saved - 4 * F + 32'000 + 16'000 + 4'000 + 8'000 + experts_saved + 8'000);
  // Its backward frees everything but the input gradient, and its largest expert moment holds
  // d(gate_up) whole (2 PAIRS_F) beside d(gate) and d(up) as they are put together.
  for (const LayerShape& shape : {qwen, qwen3, mixtral, moe_shape(64)}) {
    const TensorTrace step = layer_step_trace(shape, hf5);
    REQUIRE(step.live_items().size() == 1);
    CHECK(step.live_items()[0].name == "layer.input_grad");
  }
  // Under no_grad nothing of the block stays.
  TensorTrace no_grad;
  no_grad.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(no_grad, mixtral, hf5, false);
  CHECK(no_grad.current_bytes() == 2 * X);
  CHECK(moe_experts_parse("hf_grouped_mm", "p.yaml", "moe_experts") == MoeExperts::moe_hf_grouped_mm);
}

TEST_CASE("Unsloth's TiledMLP over a whole MoE block: every block tensor at the tile's tokens, the outputs gathered, x_gradients") {
  // Reference §12 items 34, 78 and p. 279: 4 tiles of 250 tokens. Forward without keeping: while
  // a tile's experts run, the input, residual and mlp norm output (3X), the gathered tile outputs
  // (X), and the untiled forward's block working set (its block output X, routing, one-hot, one
  // expert's tensors) at a quarter: 4X + 119,000 B. The peak is later, as the dense TiledMLP's:
  // the outputs concatenated (X) beside the gathered tiles, 5X.
  LayerShape tiled = moe_shape();
  tiled.mlp_tiles = 4;
  CHECK((X + ROUTING_SAVED + ONE_HOT + 3 * EXPERT_X + 4 * EXPERT_F) / 4 == 119'000);
  TensorTrace forward;
  forward.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(forward, tiled, eager(), false);
  CHECK(forward.peak_bytes() == 5 * X);
  CHECK(forward.peak_moment() == "mlp");
  CHECK(forward.current_bytes() == 2 * X);
  TensorTrace untiled;
  untiled.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(untiled, moe_shape(), eager(), false);
  CHECK(untiled.peak_bytes() == 4 * X + ROUTING_SAVED + ONE_HOT + 3 * EXPERT_X + 4 * EXPERT_F);
  // Backward: the block saves nothing in the layer's forward, and the recomputed tile's backward
  // peaks at a quarter of the untiled block's, beside x_gradients (X) for the whole input.
  const TensorTrace untiled_step = layer_step_trace(moe_shape(), eager());
  const TensorTrace tiled_step = layer_step_trace(tiled, eager());
  CHECK(tiled_step.peak_bytes() < untiled_step.peak_bytes() - (ROUTING_SAVED + 2 * PAIRS_X + 4 * PAIRS_F) / 2);
  CHECK(tiled_step.current_bytes() == X);
}

TEST_CASE("MoE implementations: spelled as profiles spell them, anything else refused naming the key") {
  CHECK(moe_experts_parse("hf_expert_loop", "p.yaml", "moe_experts") == MoeExperts::moe_hf_expert_loop);
  CHECK(moe_experts_parse(moe_experts_name(MoeExperts::moe_grouped_gemm), "p.yaml", "moe_experts") == MoeExperts::moe_grouped_gemm);
  CHECK_THROWS_WITH(moe_experts_parse("batched_mm", "p.yaml", "moe_experts"),
                    doctest::Contains("expected hf_expert_loop, grouped_gemm or hf_grouped_mm, got 'batched_mm'"));
}

TEST_CASE("PyTorch context parallelism (all-gather rotation): the whole sequence's K/V and an fp32 merge in forward, fp32 accumulators in backward") {
  // cp = 4 over the 1000 local tokens: the gathered K and V are 4 x (K + V) = 8K; the local
  // cat(k, v) copy 2K; the merged output fp32 2Q (Q in bf16), two fp32 temporaries of it 4Q, fp32 lse.
  LayerShape shape = shape_make();
  shape.ring = 4;
  LayerImplementation cp = eager();
  cp.context_parallel_allgather = true;
  TensorTrace forward;
  forward.alloc(kCategoryLayer, "layer.input", X);
  decoder_layer_forward(forward, shape, cp, /*keep=*/false);
  // At attention: input, norm out, q, k, v (2X + Q + 2K), the CP buffers (2K + 8K + 2Q + 4Q + lse),
  // then the output and lse (Q + lse): 2X + 8Q + 12K + 2 lse = 1,728,000, above the MLP's 3X + 4F.
  CHECK(forward.peak_bytes() == 2 * X + 8 * Q + 12 * K + 2 * LSE);
  CHECK(forward.peak_moment() == "attention");
  // Nothing of it is saved: the layer keeps the same tensors as without CP.
  CHECK(decoder_layer_saved_bytes(shape, cp) == decoder_layer_saved_bytes(shape_make(), eager()));
  // Backward (a small MLP, so that attention sets the peak): beside the layer's saved tensors and
  // the dq/dk/dv being written, the gather again (8K), fp32 dq/dk/dv accumulators 2(Q + 2K), and
  // the fp32 dk/dv all-to-all's send and receive 2 x 2 x 2K. Live then: input, incoming gradient,
  // norm out, output and the residual's gradient (5X); q, output, its gradient, dq and the fp32
  // accumulator (6Q); k, v, dk, dv, the gather, the accumulators' and the all-to-all's (24K); lse.
  LayerShape small_mlp = shape;
  small_mlp.intermediate = 8;
  const TensorTrace backward = layer_step_trace(small_mlp, cp);
  CHECK(backward.peak_moment() == "attention");
  CHECK(live_bytes_of_peak(backward, "cp.kv_gathered") == 8 * K);
  CHECK(live_bytes_of_peak(backward, "cp.grad_accumulators_fp32") == 2 * (Q + 2 * K));
  CHECK(live_bytes_of_peak(backward, "cp.kv_grad_all_to_all_fp32") == 8 * K);
  CHECK(backward.peak_bytes() == 5 * X + 6 * Q + 24 * K + LSE);
}

TEST_CASE("LoRA under bf16 autocast saves each adapter's bf16 input copy and its r-wide intermediate, QLoRA the intermediate alone") {
  // r = 4 on the shape above (h = 64, n_q d = 64, n_kv d = 16, f = 128, T = 1000, bf16). All seven
  // linears: q, k, v and gate, up each copy their h-wide input, o its 64-wide, down its f-wide:
  // T (5h + 64 + f) x 2 = 1,024,000 B; seven intermediates T x r x 2 = 56,000 B (Reference §12 item 9).
  // The frozen bf16 base's linears save no input for a weight gradient they do not make: the two
  // norm outputs (2X) and down_proj's input (F) are no longer kept (PyTorch's hooks on PEFT:
  // tests/frameworks).
  LayerShape lora = shape_make();
  lora.lora_rank = 4;
  const double dense = decoder_layer_saved_bytes(shape_make(), eager());
  CHECK(decoder_layer_saved_bytes(lora, eager()) - dense == 1'024'000 + 56'000 - 2 * X - F);
  // PEFT's default targets (q_proj, v_proj): two h-wide copies and two intermediates.
  lora.lora_all_linear = false;
  CHECK(decoder_layer_saved_bytes(lora, eager()) - dense == 2 * 128'000 + 2 * 8'000 - 2 * X - F);
  // fp32 adapters under autocast also keep bf16 casts of A [r, in] and B [out, r]: q and v's
  // 2 x 4 x (64 + 64) + 4 x (64 + 16) ... = r (in + out) x 2 B each.
  LayerShape casts = lora;
  casts.lora_adapter_casts = true;
  CHECK(decoder_layer_saved_bytes(casts, eager()) - decoder_layer_saved_bytes(lora, eager()) == 4.0 * (64 + 64) * 2 + 4.0 * (64 + 16) * 2);
  // QLoRA with autocast on casts no input (item 10): the intermediates only; bitsandbytes' 4-bit
  // matmul saves its input whether or not the weight trains, so the norm outputs stay.
  lora.lora_all_linear = true;
  lora.qlora = true;
  CHECK(decoder_layer_saved_bytes(lora, eager()) - dense == 56'000);
  // Its forward dequantizes each 4-bit weight into a [out, in] bf16 buffer and clones each result
  // (items 21, 10), one linear at a time: at the MLP, the gate's 128 x 64 x 2 = 16,384 B weight and
  // its [T, f] clone beside the input, residual and norm output (3X).
  // With 4 tokens the weights dominate: X = 512, the gate's clone 4 x 128 x 2 = 1,024 B.
  LayerShape few_tokens = lora;
  few_tokens.tokens = 4;
  TensorTrace forward;
  forward.alloc(kCategoryLayer, "layer.input", 512);
  decoder_layer_forward(forward, few_tokens, eager(), /*keep=*/false);
  CHECK(forward.peak_bytes() == 3 * 512 + 1'024 + 16'384);
  CHECK(forward.peak_moment() == "mlp");
  // Recompute and backward leave only the input gradient (every LoRA tensor released).
  const TensorTrace step = layer_step_trace(lora, eager());
  CHECK(step.current_bytes() == X);
  REQUIRE(step.live_items().size() == 1);
}
