// loss.cpp: the final norm, logits and cross entropy, untiled and in each tiled form (Liger's
// chunks, ArcticTraining's shards, Unsloth's fused chunks).
#include "models/inventory/internal.hpp"

namespace longseq::inventory {

// Logits and cross entropy over `tokens` tokens, forward then backward, as HF's ForCausalLMLoss
// runs it: logits in the activation dtype, `logits.float()`, then F.cross_entropy = log_softmax
// (saves its fp32 output) + nll_loss. The upcast copy dies when the loss function returns (log-
// softmax saves its output, not its input); the trainer keeps only the loss, so the logits die
// too. Backward: nll_loss makes a dense fp32 [T, V] gradient, log-softmax's backward a second one
// while its saved output is still live (three fp32 [T, V] at once), then the cast back to the
// activation dtype. Leaves `input_grad_name` ([tokens, h]).
//
// Soft-capped logits (Gemma 2, modeling_gemma2.py Gemma2ForCausalLM.forward: `logits = logits /
// cap; logits = torch.tanh(logits); logits = logits * cap`): each step writes a new [T, V] in the
// activation dtype and the previous one dies (dividing or multiplying by a number saves nothing);
// tanh saves its output, which lives until its backward. Backward runs the three in reverse, each
// gradient [T, V] replacing the last. Only the model's own forward caps them: a tiled loss that
// computes the logits itself (ArcticTraining's shards, TRL's chunks) passes `capped` false.
void logits_and_cross_entropy(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl,
                              double tokens, const char* input_grad_name, bool capped, bool input_freed_after_logits = false) {
  const double a = static_cast<double>(impl.activation_bytes);
  const double logits = tokens * static_cast<double>(shape.vocab);
  const bool upcast = impl.activation_bytes < 4;
  trace.alloc(kCategoryLoss, capped ? "loss.logits_uncapped" : "loss.logits", logits * a);
  if (input_freed_after_logits) trace.free("final_norm.output");
  if (capped) {
    trace.alloc(kCategoryLoss, "loss.logits_scaled", logits * a);
    trace.free("loss.logits_uncapped");
    trace.alloc(kCategoryLoss, "loss.softcap_tanh", logits * a);
    trace.free("loss.logits_scaled");
    trace.alloc(kCategoryLoss, "loss.logits", logits * a);
  }
  if (upcast) trace.alloc(kCategoryLoss, "loss.logits_fp32", logits * 4.0);
  trace.alloc(kCategoryLoss, "loss.log_softmax", logits * 4.0);
  trace.alloc(kCategoryLoss, "loss.per_token", tokens * 4.0);
  if (upcast) trace.free("loss.logits_fp32");
  trace.free("loss.logits");
  trace.set_moment("cross entropy backward");
  trace.alloc(kCategoryLoss, "loss.nll_grad", logits * 4.0);
  trace.alloc(kCategoryLoss, "loss.log_softmax_grad", logits * 4.0);
  trace.free("loss.nll_grad");
  trace.free("loss.log_softmax");
  trace.free("loss.per_token");
  const char* logits_grad = "loss.log_softmax_grad";
  if (upcast) {
    trace.alloc(kCategoryLoss, "loss.logits_grad", logits * a);
    trace.free(logits_grad);
    logits_grad = "loss.logits_grad";
  }
  if (capped) {
    // Multiplying by cap, tanh's backward (its saved output goes with it), dividing by cap.
    trace.alloc(kCategoryLoss, "loss.softcap_scale_grad", logits * a);
    trace.free(logits_grad);
    trace.alloc(kCategoryLoss, "loss.softcap_tanh_grad", logits * a);
    trace.free("loss.softcap_scale_grad");
    trace.free("loss.softcap_tanh");
    trace.alloc(kCategoryLoss, "loss.logits_uncapped_grad", logits * a);
    trace.free("loss.softcap_tanh_grad");
    logits_grad = "loss.logits_uncapped_grad";
  }
  trace.alloc(kCategoryLoss, input_grad_name, tokens * static_cast<double>(shape.hidden) * a);
  trace.free(logits_grad);
}

}  // namespace longseq::inventory

namespace longseq {

using namespace inventory;

void lm_loss_forward_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl,
                              LossImplementation loss, int64_t tile_tokens, int64_t weight_bytes) {
  if (impl.megatron_te_layer) return megatron_loss_forward_backward(trace, shape, impl);
  const Bytes bytes(shape, impl);
  const double a = static_cast<double>(impl.activation_bytes);
  const double tokens = static_cast<double>(shape.tokens);
  const double tile = static_cast<double>(std::min<int64_t>(std::max<int64_t>(tile_tokens, 1), shape.tokens));
  trace.set_moment("logits and cross entropy");
  trace.alloc(kCategoryLoss, "final_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, kCategoryLoss, kFinalNormSaved, bytes.x, shape.hidden, shape, impl);
  // An eager norm reads its input through the fp32 copy it saves, so nothing holds the last layer's
  // output past it (as inside a layer; a fused norm, Liger's, saves its input).
  if (impl.eager_rms_norm && trace.is_live("final_norm.input")) trace.free("final_norm.input");
  switch (loss) {
    case LossImplementation::loss_untiled:
      // A frozen LM head (LoRA's) saves no input for a weight gradient: the final norm's output
      // dies with the logits (PyTorch's linear saves its input only for its weight's gradient).
      logits_and_cross_entropy(trace, shape, impl, tokens, "final_norm.output_grad", shape.final_logits_softcapped,
                               /*input_freed_after_logits=*/shape.lora_rank > 0);
      break;
    case LossImplementation::loss_liger_chunked: {
      // Liger fused_linear_cross_entropy (REFERENCE §3.3a): grad_input [T, h] and grad_weight
      // [V, h] (weight dtype) and loss_1d [T] fp32 up front; per chunk the logits [C, V] in the
      // input dtype, turned into their gradient in place, and the chunk's input gradient.
      trace.alloc(kCategoryLoss, "final_norm.output_grad", bytes.x);
      trace.alloc(kCategoryLoss, "loss.weight_grad",
                  static_cast<double>(shape.vocab) * static_cast<double>(shape.hidden) * static_cast<double>(weight_bytes));
      trace.alloc(kCategoryLoss, "loss.per_token", tokens * 4.0);
      trace.alloc(kCategoryLoss, "loss.logits_chunk", tile * static_cast<double>(shape.vocab) * a);
      trace.alloc(kCategoryLoss, "loss.input_grad_chunk", tile * static_cast<double>(shape.hidden) * a);
      trace.free("loss.input_grad_chunk");
      trace.free("loss.logits_chunk");
      trace.free("loss.per_token");
      trace.free("loss.weight_grad");  // handed to the optimizer side in backward
      break;
    }
    case LossImplementation::loss_unsloth_fused:
      // UnslothFusedLoss (Reference §12 item 31): grad_inputs = empty_like(hidden_states) in
      // forward, then per chunk grad_and_value of lm_head -> F.cross_entropy(logits.float()): the
      // chunk's logits in the model dtype, their fp32 copy and its fp32 gradient (item 32).
      trace.alloc(kCategoryLoss, "final_norm.output_grad", bytes.x);
      trace.alloc(kCategoryLoss, "loss.logits_chunk", tile * static_cast<double>(shape.vocab) * a);
      trace.alloc(kCategoryLoss, "loss.logits_chunk_fp32", tile * static_cast<double>(shape.vocab) * 4.0);
      trace.alloc(kCategoryLoss, "loss.logits_chunk_grad_fp32", tile * static_cast<double>(shape.vocab) * 4.0);
      for (const char* name : {"loss.logits_chunk_grad_fp32", "loss.logits_chunk_fp32", "loss.logits_chunk"}) trace.free(name);
      break;
    case LossImplementation::loss_token_shards:
      // ArcticTraining TiledFusedLogitsLoss (REFERENCE §3.3b): x_grad = zeros_like(x), then per
      // shard forward and backward of the untiled loss.
      trace.alloc(kCategoryLoss, "final_norm.output_grad", bytes.x);
      logits_and_cross_entropy(trace, shape, impl, tile, "loss.input_grad_shard", /*capped=*/false);
      trace.free("loss.input_grad_shard");
      break;
  }
  trace.set_moment("final norm backward");
  eager_norm_backward_transients(trace, kCategoryLoss, kFinalNormSaved, bytes.x_fp32, impl);
  trace.alloc(L, "layer.output_grad", bytes.x);
  eager_norm_saved_free(trace, kFinalNormSaved, shape, impl);
  trace.free("final_norm.output_grad");
  if (trace.is_live("final_norm.output")) trace.free("final_norm.output");
  if (trace.is_live("final_norm.input")) trace.free("final_norm.input");
}

}  // namespace longseq
