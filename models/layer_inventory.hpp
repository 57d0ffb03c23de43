// layer_inventory.hpp: every tensor one decoder layer, the final norm and the LM loss create on a
// rank, in the order a runtime creates and releases them. The planner replays it into a
// TensorTrace to predict peak memory; the executor allocates the same tensors by the same names.
//
// Shapes (per rank; b = micro batch, S_l = S/sp local tokens, T = b*S_l):
//   X      [T, h]                      hidden states, norm outputs, residuals
//   Q      [T, n_q*d]                  = [b, S, n_q/sp, d] after the all-to-all
//   K, V   [T, n_kv*r*d]               r = kv replication (Ulysses repeats kv heads when sp > n_kv)
//   F      [T, f]                      MLP intermediates (per tile when tiled: [T/tiles, f])
//   lse    [T, n_q] fp32               = [b, n_q/sp, S] softmax statistics
// Invariant: a schedule frees every tensor it allocates except the ones it documents as kept.
#pragma once

#include <cstdint>
#include <string_view>
#include <string>

#include "models/model_spec.hpp"
#include "models/tensor_trace.hpp"

namespace longseq {

// Megatron-Core's selective recompute (recompute_granularity "selective" with recompute_modules;
// reference-megatron-core M5.1): outputs discarded once the forward that reads them is done and
// recomputed in backward (tensor_parallel.CheckpointWithoutOutput), the layer otherwise keeping what
// it saves: a separate input or pre-MLP norm's output ("layernorm": MLA's input norm, the MoE layer's
// pre-MLP norm), the MoE experts' activation ("moe_act") and MLA's up-projected q, k and v
// ("mla_up_proj", planned without context parallelism); and, checkpointed whole (tensor_parallel.checkpoint:
// its input kept, its forward rerun in backward, whose output is held through its backward), a dense
// layer's MLP with the norm fused into fc1 ("mlp").
struct MegatronRecomputeModules {
  bool layernorm = false, moe_act = false, mla_up_proj = false, mlp = false;
  bool any() const { return layernorm || moe_act || mla_up_proj || mlp; }
  bool operator==(const MegatronRecomputeModules&) const = default;
};

struct LayerShape {
  int64_t tokens = 0;          // T = b * S_l
  int64_t sp = 1;              // Ulysses degree (1: no all-to-all)
  int64_t ring = 1;            // ring attention degree (1: none): key/value blocks travel around r ranks
  int64_t hidden = 0;          // h
  int64_t q_width = 0;         // n_q * d
  int64_t kv_width = 0;        // n_kv * d: k_proj (and v_proj) output width
  int64_t kv_replication = 1;  // r: Ulysses repeats kv heads r times before the all-to-all when sp > n_kv
  int64_t num_q_heads = 0;     // n_q (for lse)
  int64_t intermediate = 0;    // f
  int64_t vocab = 0;           // V
  // Gemma 2 soft-caps its final logits (cap * tanh(logits / cap)) in the model's forward, before
  // the loss: two more logits-sized tensors pass through, and tanh saves its output for backward
  // (priced for the untiled loss, which runs the model's forward; models/inventory/loss.cpp).
  bool final_logits_softcapped = false;
  MlpKind mlp_kind = MlpKind::mlp_kind_swiglu;
  int64_t mlp_tiles = 0;       // 0: untiled MLP
  // FPDT (0: off): local tokens per attention chunk, b * chunk / sp. Attention then holds chunk-
  // sized buffers on the GPU, its q/k/v/output chunks live in host memory, and the MLP writes its
  // input gradient into its input's storage (FPDT_FFN) instead of a separate buffer.
  int64_t fpdt_chunk_tokens = 0;
  bool qk_norm = false;        // per-head RMSNorm on q and k before RoPE (Qwen3)
  // Gemma 2/3: a norm after attention and after the MLP too (over the block's output, before the
  // residual add), and every norm scaling by (1 + w) in fp32 (ModelSpec::norm_scale_fp32).
  bool post_norms = false;
  bool norm_scale_fp32 = false;
  int64_t head_dim = 0;        // d (a q/k norm's width)
  bool fused_projections = false;  // q/k/v and gate/up are slices of one output each (Phi-3)
  int64_t num_kv_heads = 0;    // n_kv (for k_norm's statistics)
  int64_t sequences = 1;       // sequences the attention kernel sees in one call (its batch)
  // Mixture of experts in place of the MLP (experts 0: the dense MLP above). E routed experts of
  // width I_e, k per token, shared experts of total width I_s on every token (with a sigmoid gate:
  // Qwen2-MoE). Routing is taken as balanced: each expert sees T*k/E tokens (a skewed router makes
  // the busiest expert's share larger, and with it the per-expert transients of the expert loop).
  int64_t experts = 0;                     // E
  int64_t experts_per_token = 0;           // k
  int64_t expert_intermediate = 0;         // I_e
  int64_t shared_expert_intermediate = 0;  // I_s (0: none)
  bool shared_expert_gate = false;
  bool moe_normalize_topk = true;          // the chosen weights divided by their sum (ModelSpec)
  bool moe_routing_weights_fp32 = false;   // the router's weights reach the experts in fp32 (Mixtral)
  // LoRA adapters (rank 0: none) on every linear or on q_proj/v_proj only, over a bf16 base or a
  // 4-bit one (QLoRA), trained under bf16 autocast (the HF Trainer's bf16=True; Reference §12 item 9).
  int64_t lora_rank = 0;
  bool lora_all_linear = true;
  bool qlora = false;
  // False for the first decoder layer of a model whose embedding is frozen (LoRA): its input needs
  // no gradient, so an eager input norm with a frozen weight saves nothing and backward stops at
  // the layer's projections (no input gradient, PyTorch's autograd skips what needs none).
  bool input_requires_grad = true;
  // fp32 adapters under bf16 autocast (PEFT's dtype, the Trainer's bf16=True): autocast casts each
  // adapter's A and B to bf16 and the adapters' matmuls save the casts for backward.
  bool lora_adapter_casts = false;
  // Megatron-Core's tensor parallelism (1: none). The widths above are then one TP rank's share
  // (q_width, kv_width, the heads, intermediate and vocab divided by tp), and its sequence
  // parallelism keeps every tensor of the residual stream as [T/tp, h] (hidden_state_tokens).
  int64_t tp = 1;
  int64_t hidden_state_tokens() const { return tokens / (tp > 0 ? tp : 1); }
  // Megatron-Core's expert parallelism (1: none): a rank holds experts / ep of the experts and its
  // dispatcher exchanges the routed tokens with the other ep - 1 ranks (megatron_moe.cpp).
  int64_t ep = 1;
  // Multi-head latent attention (ModelSpec::LatentAttention; kv rank 0: none), as Megatron-Core builds
  // it (megatron_mla.cpp): the q latent's width (0: q projected directly), the kv latent's, the
  // rotary key's (one per token, shared by the heads). q_width and kv_width are then q's and k's
  // (this rank's heads of head_dim), v_width the values' and the attention output's.
  int64_t mla_q_rank = 0, mla_kv_rank = 0, mla_rope_dim = 0;
  int64_t v_width = 0;  // 0: kv_width (the values as wide as the keys)
  int64_t value_width() const { return v_width > 0 ? v_width : kv_width; }
  bool latent_attention() const { return mla_kv_rank > 0; }
  // Megatron's router as DeepSeek-V3 runs it (ModelSpec::moe_router_sigmoid): sigmoid scores over
  // every expert, and its logits in fp32 (moe_router_dtype "fp32", as Megatron-Bridge's DeepSeek
  // provider sets and longseq's export writes).
  bool moe_router_sigmoid = false;
  bool moe_router_fp32 = false;
  MegatronRecomputeModules recompute;  // Megatron's selective recompute (none: every output kept)
};

// How the experts of a mixture-of-experts block run (Reference §12 items 45-47, 80):
enum class MoeExperts {
  // transformers v4's Python loop over an nn.ModuleList of expert MLPs (Mixtral, Qwen2/3-MoE
  // SparseMoeBlock): per expert a gathered copy of its tokens, its MLP, the weighted output
  // index_add_'ed into the block's output; backward runs expert by expert.
  moe_hf_expert_loop,
  // All experts in one grouped GEMM over the T*k token-expert pairs sorted by expert (ArcticMoE's
  // GroupGeMM): the loop's saved tensors, but every transient is the whole T*k at once.
  moe_grouped_gemm,
  // transformers 5's default, grouped_mm_experts_forward (integrations/moe.py): the pairs sorted by
  // expert, one grouped_mm for the fused gate_up (one [T*k, 2 I] storage) and one for down, and
  // the int64 sort order, gather index and inverse order, the int32 group offsets and the pairs'
  // weights saved beside them. Held to PyTorch's saved-tensor hooks (tests/frameworks).
  moe_hf_grouped_mm,
};
const char* moe_experts_name(MoeExperts experts);  // "hf_expert_loop", "grouped_gemm", "hf_grouped_mm" (as profiles spell them)
// Throws ConfigError(source, key, ...) for any other spelling.
MoeExperts moe_experts_parse(const std::string& text, const std::string& source, const std::string& key);

// What the runtime's kernels allocate beyond the tensors themselves (see runtime profiles).
// A decoder layer's parameter gradients as backward leaves them in param.grad, bytes: each appears
// when its GEMM's backward runs and stays to the end of the step (all 0 where the planner prices
// gradients elsewhere: model states held all step, ZeRO's or FSDP2's buffers).
struct LayerWeightGradients {
  double mlp_down = 0;          // down_proj's: the first GEMM a dense MLP's backward runs
  double mlp_rest = 0;          // the rest of the MLP block, at its end (a MoE block's all: router, experts, shared experts)
  double attention_output = 0;  // o_proj's: the first of the attention block's backward
  double attention_rest = 0;    // q, k, v (their biases, q/k norms) and the layer's norms, at the attention's end
};

struct LayerImplementation {
  int64_t activation_bytes = 2;          // per element of X, Q, K, V, F
  int64_t ulysses_staging_copies = 2;    // extra buffers live during one all-to-all
  bool flash_attention_dq_accumulator = false;   // fp32 dq accumulator in attention backward
  bool flash_attention_expands_gqa_grads = false;// dk/dv allocated at q-head width, then summed
  // FlashAttention-3's backward instead (hopper/flash_api.cpp, REFERENCE §9): fp32 dq accumulator,
  // fp32 softmax_d and softmax_lse_log2, and with GQA fp32 dk/dv accumulators at kv width (no
  // expansion to the q heads).
  bool flash_attention_3 = false;
  bool fused_swiglu = false;             // SwiGLU saves gate and up only (Liger), not SiLU(gate)
  // HF's eager RMSNorm (no Liger): each norm saves an fp32 upcast of its input and its normalized
  // value in the activation dtype beside its output (modeling_llama.py LlamaRMSNorm, REFERENCE §7.2).
  bool eager_rms_norm = false;
  // FlashAttention-2 varlen backward: dq accumulator and softmax_d padded by this many rows per
  // sequence (flash_api.cpp L1100, L1113). FlashAttention-3 pads by its own 64 (REFERENCE §9).
  int64_t flash_attention_varlen_pad_rows = 0;
  // ZeRO-3 with TiledMLP: the MLP's weight gradients of every shard held until the last shard's
  // backward is done (bytes; 0: none beyond the ZeRO buffers' one matrix in flight).
  double mlp_tile_weight_grads_bytes = 0;
  MoeExperts moe_experts = MoeExperts::moe_hf_expert_loop;
  // With shape.ring > 1: PyTorch context parallelism (Reference §11 F2.3-F2.5) instead of USP's
  // ring of key/value blocks, rotating K/V by all-gather (its default) or, with
  // `context_parallel_all_to_all`, by passing one block to the next rank per step.
  bool context_parallel_allgather = false;
  bool context_parallel_all_to_all = false;
  LayerWeightGradients weight_gradients;
  // Megatron-Core's GPT layer with Transformer Engine (its default spec) instead of a Hugging Face
  // decoder layer, and its vocabulary-parallel loss (models/inventory/megatron.cpp); with
  // `megatron_te_cross_entropy` the loss is TE's fused kernel (cross_entropy_fusion_impl "te"), else
  // Megatron's native one.
  bool megatron_te_layer = false;
  bool megatron_te_cross_entropy = false;
  // The fused SwiGLU (bias_activation_fusion: bias_swiglu_impl saves only its input), or the
  // unfused glu (chunk, silu, multiply: silu's output saved beside the input).
  bool megatron_fused_swiglu = true;
  // Transformer Engine's FP8 linears in Megatron's layer (PlanOptions::fp8; reference-megatron-core
  // M10): each saves its input quantized, one byte an element, and quantizes the output gradient
  // in backward; with `te_fp8_transposed_copies` (HardwareCard::fp8_transposed_copies) a tensor a
  // GEMM reads both ways is held twice while both are needed (row-wise and transposed).
  bool te_fp8 = false;
  bool te_fp8_transposed_copies = true;
  // With shape.ring > 1 in Megatron's layer: its cp_comm_type all_gather (PlanOptions::cp_all_gather,
  // M2.2) in place of p2p's ring of K/V blocks.
  bool megatron_cp_all_gather = false;
};

// Category names of traces and breakdowns, shared by the planner's predictions and the executor's
// measurements (in the order reports print them).
inline constexpr const char* kCategoryModelStates = "model_states";
inline constexpr const char* kCategoryZero = "zero_buffers";
inline constexpr const char* kCategoryCheckpoints = "activation_checkpoints";
inline constexpr const char* kCategoryLayer = "layer_working_set";
inline constexpr const char* kCategoryLoss = "logits_and_loss";
inline constexpr const char* kCategoryInputs = "inputs";
inline constexpr const char* kCategoryRuntime = "runtime_overheads";
inline constexpr const char* kCategoryHost = "host";
inline constexpr const char* kCategoryCalibrated = "calibrated_overhead";

// Forward of one decoder layer. Expects "layer.input" live; leaves "layer.output" live. With
// keep_for_backward (recompute, or no checkpointing) it also leaves live what backward needs.
void decoder_layer_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl,
                           bool keep_for_backward);

// Backward of one decoder layer after decoder_layer_forward(keep_for_backward=true). Expects
// "layer.output_grad" live; frees it, the kept tensors, "layer.input" (where the caller still holds
// it: a checkpoint, or a fused norm's saved input) and "layer.output" (where still live: a reentrant
// recompute's), and leaves "layer.input_grad" live (none where shape.input_requires_grad is
// false), with the layer's weight gradients where impl.weight_gradients prices them ("grad.*").
void decoder_layer_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl);

// Bytes a layer keeps for backward when it runs forward with keep_for_backward, excluding its
// output and including its input where a fused norm saves it (an eager norm saves its fp32 copy
// instead): the per-layer activation memory without checkpointing.
double decoder_layer_saved_bytes(const LayerShape& shape, const LayerImplementation& impl);

// Bytes a layer keeps under torchtitan's op-level selective checkpointing (v0.2.2,
// distributed/activation_checkpoint.py _apply_op_sac with models/llama3/infra/parallelize.py's
// _op_sac_save_list): the checkpoint's input, SDPA's outputs (the attention output and its fp32
// logsumexp), and the output of every other aten.mm, counted from 1 within the layer's forward,
// so the 1st, 3rd, 5th and 7th of wq, wk, wv, wo, w1, w3, w2: q_proj's [T, n_q d], v_proj's
// [T, n_kv d], gate_proj's [T, f] and down_proj's [T, h]. Everything else is recomputed in backward.
// For a dense SwiGLU layer with separate projections and no biases (addmm is not in the list),
// which is what torchtitan's llama3 and qwen3 flavors build.
double decoder_layer_op_selective_saved_bytes(const LayerShape& shape, const LayerImplementation& impl);

// Bytes each Megatron MoE layer's all-to-all dispatcher keeps from its forward to its next one (its
// probabilities, routing map and permutation map: attributes nothing clears), through recompute and
// backward alike; 0 for a dense layer. Per layer and rank, beside what the layer saves for backward.
double megatron_moe_dispatcher_held_bytes(const LayerShape& shape, const LayerImplementation& impl);

// What a pinned host allocation of `bytes` takes. PyTorch's pinned host allocator
// (CachingHostAllocator.h, allocate) rounds every allocation up to the next power of two
// (pytorch issues #150517, #95823; REFERENCE §7.5); `power_of_two` says the stack allocates
// through it.
double pinned_host_allocation_bytes(double bytes, bool power_of_two);

// Bytes FPDT keeps per rank in pinned host memory for the layer being computed: its q, k, v,
// output and lse chunks, the input chunks, and the fp32 dq accumulators of backward. Each chunk of
// each is its own pinned allocation (DS fpdt_layer.py SequenceChunk; REFERENCE §3.6), so with
// `pinned_power_of_two` each is rounded as pinned_host_allocation_bytes does.
double fpdt_host_bytes(const LayerShape& shape, const LayerImplementation& impl, bool pinned_power_of_two);

// longseq's own executor (executor/llama_step.hpp), tensor for tensor and in its order: RoPE in place,
// Ulysses through staging buffers, ring attention's key/value blocks and fp32 accumulators (when
// shape.ring > 1), SwiGLU keeping gate/up/product with separate gradient buffers,
// RMSNorm keeping its rstd, attention backward with FlashAttention-2's softmax delta, a cross
// entropy that writes the logits' gradient without a log-softmax copy, checkpoint offload that
// keeps a layer's input on the device until the next layer is done (the copy overlaps it) and
// fetches inputs one layer ahead in backward. The whole step is replayed, every layer, since the
// executor's peak is exactly what it allocates.
// `shape.mlp_tiles` 0 is untiled; `loss_tile_tokens` 0 is untiled.
struct ExecutorStepOptions {
  int64_t layers = 0;
  // Bytes of an activation (and weight) element as the kernels read it: 4 on the CPU (fp32), 2 on
  // a GPU (bf16). Gradients, rstd, lse, softmax delta and per-token losses are fp32 on both.
  int64_t activation_bytes = 4;
  // The blocked attention's block (0: a kernel that takes no workspace, the CPU's): its workspace
  // (kernels/blocked_attention.hpp) is allocated around each attention forward and backward.
  int64_t attention_block_tokens = 0;
  bool checkpointing = false;
  bool checkpoint_offload = false;
  int64_t loss_tile_tokens = 0;
  // ZeRO over this many ranks (0: off): with gather_weights (ZeRO-3) each module's weights are
  // all-gathered when it runs (a one-chunk staging buffer first with offload_params); with
  // scatter_gradients (ZeRO-2/3, or an offloaded optimizer) its gradient is produced whole and
  // reduce-scattered. Module sizes in parameters: the embedding, one decoder layer, and the final
  // norm with the LM head (just the norm when tied).
  int64_t zero_ranks = 0;
  bool gather_weights = false, scatter_gradients = false, offload_params = false;
  // FSDP2's regime with bf16 kernels (PrecisionRegime::fsdp2): each module's fp32 shard is cast
  // into a one-chunk "fsdp.cast_shard" for its all-gather (no bf16 shard is kept).
  bool cast_shards = false;
  // The pure-bf16 regime (PrecisionRegime::pure_bf16, bf16 gradients): each module's gradient is
  // produced in a module-sized fp32 "module_gradient_fp32" and added into the bf16 gradients.
  bool module_gradients_fp32 = false;
  int64_t embedding_parameters = 0, layer_parameters = 0, final_parameters = 0;
  bool tied_embeddings = false;
  // Ring attention with PyTorch CP's all-gather rotation (TrainingOptions::context_parallel_all_gather).
  bool context_parallel_all_gather = false;
};
// The executor's name for what a LoRA-adapted linear keeps (its r-wide x A^T): "lora.q_proj_rank"
// for "q_proj", and so on.
const char* executor_lora_rank_name(std::string_view linear);
// With `host`, the host pool's allocations too (offloaded checkpoints, FPDT's chunks), in order.
void executor_step_replay(TensorTrace& trace, const LayerShape& shape, const ExecutorStepOptions& options, TensorTrace* host = nullptr);

enum class LossImplementation {
  loss_untiled,        // HF: logits, fp32 upcast, log-softmax; backward holds three fp32 [T, V]
  loss_liger_chunked,  // Liger fused linear cross entropy: gradients computed in forward, per chunk
  loss_token_shards,   // fixed token shards: per shard the untiled tensors, input grad accumulated
  loss_unsloth_fused,  // Unsloth's fused CE: the input gradient up front, per chunk logits, fp32 copy and fp32 gradient
};

// Logits and loss, forward and backward, for this rank's tokens. Expects "final_norm.input" (the
// last layer's output) live; frees it (an eager norm as soon as its fp32 copy is made) and leaves
// "layer.output_grad" live (the gradient entering the last layer).
// `tile_tokens`: tokens per chunk/shard (ignored when untiled).
void lm_loss_forward_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl,
                              LossImplementation loss, int64_t tile_tokens, int64_t weight_bytes);

}  // namespace longseq
