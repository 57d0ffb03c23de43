#include "planner/time_model.hpp"

#include "models/adapters.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <fmt/format.h>

#include "planner/comm_model.hpp"
#include "planner/memory_model.hpp"
#include "planner/pipeline.hpp"

namespace longseq {

StepTime& StepTime::operator+=(const StepTime& other) {
  matmul_s += other.matmul_s;
  attention_s += other.attention_s;
  ulysses_all_to_all_s += other.ulysses_all_to_all_s;
  zero_communication_exposed_s += other.zero_communication_exposed_s;
  checkpoint_offload_s += other.checkpoint_offload_s;
  fpdt_fetch_exposed_s += other.fpdt_fetch_exposed_s;
  ring_exposed_s += other.ring_exposed_s;
  ring_final_hop_s += other.ring_final_hop_s;
  tensor_parallel_exposed_s += other.tensor_parallel_exposed_s;
  expert_all_to_all_s += other.expert_all_to_all_s;
  activation_offload_s += other.activation_offload_s;
  pipeline_bubble_s += other.pipeline_bubble_s;
  pipeline_p2p_s += other.pipeline_p2p_s;
  gradient_offload_s += other.gradient_offload_s;
  optimizer_s += other.optimizer_s;
  elementwise_s += other.elementwise_s;
  return *this;
}

double StepTime::total_s() const {
  return matmul_s + attention_s + ulysses_all_to_all_s + zero_communication_exposed_s + checkpoint_offload_s +
         fpdt_fetch_exposed_s + ring_exposed_s + ring_final_hop_s + tensor_parallel_exposed_s + expert_all_to_all_s + activation_offload_s + pipeline_bubble_s + pipeline_p2p_s +
         gradient_offload_s + optimizer_s + elementwise_s;
}

namespace {

// The MLP's width a token passes through: a dense layer's intermediate size, or a MoE layer's k
// routed experts' and its shared experts'.
double mlp_width_per_token(const ModelSpec& model) {
  return static_cast<double>(model.is_moe() ? model.experts_per_token * model.expert_intermediate_size + model.shared_expert_intermediate_size
                                            : model.intermediate_size);
}

}  // namespace

double layer_elementwise_bytes_per_token(const ModelSpec& model, int64_t activation_bytes) {
  const double h = static_cast<double>(model.hidden_size), a = static_cast<double>(activation_bytes);
  const double mlp_width = mlp_width_per_token(model);
  const double gated = model.mlp_kind == MlpKind::mlp_kind_swiglu ? 3.0 : 2.0;
  return a * (2.0 * 2.0 * h + 2.0 * static_cast<double>(model.q_width() + model.kv_width()) + 2.0 * 3.0 * h + gated * mlp_width);
}

double cost_per_billion_tokens(double tokens_per_s, int64_t gpus, double gpu_hour_cost) {
  if (!(tokens_per_s > 0) || !(gpu_hour_cost > 0)) return 0;
  return 1e9 / tokens_per_s / 3600.0 * static_cast<double>(gpus) * gpu_hour_cost;
}

double attention_tflops(const HardwareCard& card, int64_t head_dim, const std::string& kernel) {
  const AttentionKernelFacts& facts = attention_kernel_facts(kernel);
  const double hd64 = card.*facts.tflops_hd64, hd128 = card.*facts.tflops_hd128;
  if (hd128 <= 0)
    throw std::invalid_argument(fmt::format("attention_tflops: {} has no rate for {} (attention_kernel_problem reports this)", card.name,
                                            facts.label));
  // Past the kernel's largest head dim only SDPA runs (another backend: plan_report's caveat says
  // so); priced at the head dim as given.
  const int64_t compiled_head_dim = attention_kernel_head_dim(facts, head_dim);
  const int64_t computed_head_dim = compiled_head_dim > 0 ? compiled_head_dim : head_dim;
  const double d = std::clamp(static_cast<double>(computed_head_dim), 64.0, 128.0);
  // The kernel runs the padded head dim's FLOPs; this rate is on the model's own, fewer.
  return (hd64 + (hd128 - hd64) * (d - 64.0) / 64.0) * static_cast<double>(head_dim) / static_cast<double>(computed_head_dim);
}

double fp8_matmul_achieved_tflops(const HardwareCard& card) {
  return card.peak_bf16_tflops > 0 ? card.peak_fp8_tflops * card.matmul_achieved_tflops / card.peak_bf16_tflops : 0.0;
}

std::string fp8_rate_caveat(const HardwareCard& card) {
  return fmt::format("FP8: the decoder layers' GEMMs are priced at {:.0f} TFLOPS, {}'s measured bf16 matmul share of peak ({:.1f}%) "
                     "applied to its dense FP8 peak of {:g} (no FP8 GEMM measurement is in the sources) [approx]",
                     fp8_matmul_achieved_tflops(card), card.name, 100.0 * card.matmul_achieved_tflops / card.peak_bf16_tflops,
                     card.peak_fp8_tflops);
}

std::string attention_kernel_problem(const RuntimeProfile& profile, const HardwareCard& card, int64_t head_dim) {
  const std::string kernel = attention_kernel_resolve(profile.attention_kernel, card);
  const AttentionKernelFacts& facts = attention_kernel_facts(kernel);
  if (card.*facts.tflops_hd128 <= 0)
    return fmt::format("attention {}: {} {}; {} has no rate for it (use fa2)", kernel, facts.label, facts.availability, card.name);
  // A kernel SDPA does not run has no other backend to fall to past its largest head dim (under
  // SDPA another backend takes it, and plan_report says so).
  if (!facts.sdpa_backend && head_dim > 0 && attention_kernel_head_dim(facts, head_dim) == 0)
    return fmt::format("attention {}: {} runs head dims up to {} ({}); this model's head_dim is {} (--attention sdpa)", kernel,
                       facts.label, facts.compiled_head_dims.back(), facts.compiled_head_dims_source, head_dim);
  return "";
}

namespace {

double as_double(int64_t value) { return static_cast<double>(value); }

double pcie_seconds(double bytes, double gbps) { return bytes / (gbps * 1e9); }

// Ring attention (ring-flash-attention's schedule): in each of r - 1 steps of an attention pass a
// rank sends the block it holds (`bytes`) to the next ring rank while computing on it; the
// transfer beyond that step's share of the pass's compute is exposed.
double ring_exposed_pass_s(const Link& link, double ring, double bytes, double pass_compute_s) {
  const double transfer_s = link.latency_us * 1e-6 + bytes / (link.busbw_gbps * 1e9);
  return (ring - 1.0) * std::max(0.0, transfer_s - pass_compute_s / ring);
}

// After backward's last step the fp32 dk/dv accumulators make one more hop to the block's owner
// with no attention left to hide it (zhuzilin's ring sends dK/dV r times, K/V r - 1 times:
// REFERENCE §10.2 F1.3; longseq's executor does the same).
double ring_homecoming_s(const Link& link, double accumulator_bytes) {
  return link.latency_us * 1e-6 + accumulator_bytes / (link.busbw_gbps * 1e9);
}

// Ulysses' all-to-alls of one attention pass (q, k, v in; the output back).
double ulysses_pass_s(const Link& link, double bytes, int64_t sp) {
  return 3.0 * link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_to_all, bytes, sp, link);
}

// One layer's ring passing against `forward_attention_s` of forward attention per rank: a key/value
// block is k and v of this rank's S/(u r) tokens at its kv heads after the Ulysses all-to-all
// (replicated as Ulysses replicates them); backward passes it with its fp32 dk/dv accumulators
// against 2.5x the compute (FlashAttention-2: 2.5 forward FLOPs), then the accumulators' last hop.
// Ulysses groups are consecutive ranks, so ring neighbours are u apart: inside a node while u x r fits.
// Under tensor parallelism the TP ranks are the consecutive ones (Megatron's rank order tp-cp-dp,
// parallel_state.py L562, order "tp-cp-ep-dp-pp"): a sequence's u x r ranks lie t apart and span
// t u r ranks (`rank_stride` = t).
struct RingLayerPassing {
  double forward_exposed_s = 0, backward_exposed_s = 0, final_hop_s = 0;
};

// PyTorch context parallelism passes blocks the same way with its all-to-all rotation (and its
// fp32 dK/dV always so, Reference §11 F2.5); with its default all-gather rotation each attention
// pass gathers the whole sequence's K/V at once (F2.3: issued before the local block's compute and
// waited for at the next step), so only the first step's compute hides the gather. Megatron-Core's
// all_gather (M2.2) gathers them before the attention runs, "not async, and cannot be overlapped", and
// its backward gathers them again and reduce-scatters dK and dV in the activation dtype, all exposed.
enum class KvExchange { kv_ring_blocks, kv_torch_all_gather, kv_megatron_all_gather };
RingLayerPassing ring_layer_passing(const ModelSpec& model, const ClusterSpec& cluster, int64_t micro_batch, int64_t seqlen, int64_t sp,
                                    int64_t ring, int64_t activation_bytes, double forward_attention_s, KvExchange exchange,
                                    int64_t rank_stride = 1) {
  const Link link = link_for_group(cluster, sp * ring * rank_stride);
  const double r = as_double(ring), a = as_double(activation_bytes);
  const double tokens = as_double(micro_batch) * as_double(seqlen / (sp * ring));
  const double block_bytes = tokens * as_double((model.kv_width() + model.v_width()) * kv_replication_factor(model, sp)) * a;  // K and V
  const double accumulator_bytes = block_bytes / a * 4.0;
  if (exchange == KvExchange::kv_ring_blocks)
    return {ring_exposed_pass_s(link, r, block_bytes, forward_attention_s),
            ring_exposed_pass_s(link, r, block_bytes + accumulator_bytes, 2.5 * forward_attention_s),
            ring_homecoming_s(link, accumulator_bytes)};
  const double gather_s = link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_gather, r * block_bytes, ring, link);
  if (exchange == KvExchange::kv_megatron_all_gather)
    return {gather_s, gather_s + link.latency_us * 1e-6 + collective_seconds(Collective::collective_reduce_scatter, r * block_bytes, ring, link), 0.0};
  return {std::max(0.0, gather_s - forward_attention_s / r),  // PyTorch's all-gather rotation
          std::max(0.0, gather_s - 2.5 * forward_attention_s / r) + ring_exposed_pass_s(link, r, accumulator_bytes, 2.5 * forward_attention_s),
          ring_homecoming_s(link, accumulator_bytes)};
}

// What DeepSpeed's offloaded optimizer costs a step (DeepSpeed v0.17.0, REFERENCE §7.5 and §9), per
// rank, all of it exposed: the copies are blocking and the host work runs on the training thread,
// in backward's gradient hooks or in step() after backward.
//  - Backward, ZeRO-3: each reduce-scattered bf16 gradient partition is copied into the pageable
//    host buffer grad_partitions_flat_buffer (stage3.py L1479), its norm taken there and cast to the
//    fp32 .grad of its sub-group (L1512): the buffer read twice, the fp32 gradient written. Without
//    that buffer (ZeRO-1/2) the fp32 gradient comes down directly.
//  - step(), serially per sub-group: unscale_and_clip_grads multiplies the fp32 gradient in place
//    (read and written); CPU Adam reads the gradient and reads and writes master, m and v; the
//    updated master is cast to bf16 on the CPU (read, write) and copied up to the GPU partition
//    (pageable), or, with the parameters offloaded, kept in the host's bf16 partition.
// The host passes are bound by DRAM bandwidth, which every rank of the node shares, at the share of
// it CPU Adam achieves (the profile's, from a measurement). The PCIe copies run at the card's
// measured pinned rate: ALST's pageable copies (pin_memory false) can only be slower, so this is a
// lower bound on them.
struct OffloadedStep {
  double gradient_download_s = 0;  // in backward
  double host_passes_s = 0;        // the node's DRAM traffic of the gradient passes and the step
  double weight_upload_s = 0;      // updated bf16 weights back to the GPU
};

OffloadedStep offloaded_optimizer_step(const RuntimeProfile& profile, const PlanOptions& plan, const HardwareCard& card,
                                       double partition_params, double ranks_per_node) {
  const double buffer_bytes = plan.zero_stage == 3 ? as_double(profile.zero3_offload_gradient_buffer_bytes) : 0.0;
  const double gradient = as_double(profile.gradient_bytes), master = as_double(profile.master_weight_bytes);
  const double states = as_double(profile.optimizer_state_bytes), weight = as_double(profile.weight_bytes);
  const double download_bytes = buffer_bytes > 0 ? buffer_bytes : gradient;
  const double buffer_passes = buffer_bytes > 0 ? 2.0 * buffer_bytes + gradient : 0.0;  // norm read, cast read, fp32 write
  const double unscale = 2.0 * gradient;
  const double adam = gradient + 2.0 * (master + states);
  const double weight_cast = master + weight;
  const double host_bytes_per_param = buffer_passes + unscale + adam + weight_cast;
  OffloadedStep step;
  step.gradient_download_s = pcie_seconds(partition_params * download_bytes, card.pcie_device_to_host_gbps);
  step.host_passes_s = partition_params * ranks_per_node * host_bytes_per_param /
                       (card.host_memory_gbps * profile.cpu_adam_bandwidth_efficiency * 1e9);
  if (!plan.offload_params) step.weight_upload_s = pcie_seconds(partition_params * weight, card.pcie_host_to_device_gbps);
  return step;
}

}  // namespace

TimePrediction time_predict(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                            const RuntimeProfile& profile, int64_t seqlen) {
  const HardwareCard& card = cluster.hardware;
  const ParameterCount params = parameter_count(model);
  const double world = as_double(cluster.gpus);
  // A rank's decoder layers: its pipeline stage's (the largest stage's, which the schedule waits on),
  // whose per-layer traffic it pays.
  const double layers = as_double(plan.pp > 1 ? pipeline_split(model, plan).largest() : model.num_layers);
  const double recompute = recomputed_layer_share(model, plan);
  TimePrediction prediction;
  prediction.executed_flops = step_flops_executed(model, plan, seqlen);
  prediction.model_flops = step_flops_model(model, plan, seqlen);

  prediction.attention_kernel = attention_kernel_for(profile, card, plan);
  StepTime& time = prediction.time;
  time.matmul_s = prediction.executed_flops.matmul / (card.matmul_achieved_tflops * 1e12);
  if (prediction.executed_flops.matmul_fp8 > 0) time.matmul_s += prediction.executed_flops.matmul_fp8 / (fp8_matmul_achieved_tflops(card) * 1e12);
  time.attention_s = prediction.executed_flops.attention / (attention_tflops(card, model.head_dim, prediction.attention_kernel) * 1e12);
  const double layer_compute_s = time.matmul_s + time.attention_s;
  // A layer's attention time split into its passes: forward, the recompute's forward, and the
  // backward at 2.5 forward FLOPs (FlashAttention-2); what hides the ring's and FPDT's traffic.
  const double attention_per_layer_s = time.attention_s / layers;
  const double attention_forward_share = 1.0 / (1.0 + 2.5 + recomputed_attention_share(model, plan));

  // A tensor-parallel rank's heads: Ulysses' exchanges and the ring's blocks carry 1/t of them.
  ModelSpec rank_heads = model;
  rank_heads.num_q_heads = model.num_q_heads / std::max<int64_t>(1, plan.tp);
  rank_heads.num_kv_heads = model.num_kv_heads / std::max<int64_t>(1, plan.tp);

  // Ulysses: four all-to-alls (q, k, v, output) per layer in forward, again in the recompute,
  // and mirrored in backward; in the profile's activation dtype (ALST: bf16).
  if (plan.sp > 1) {
    const Link link = link_for_group(cluster, plan.sp * std::max<int64_t>(1, plan.tp));  // (its ranks t apart under TP)
    // The Ulysses group holds S / r tokens of the sequence.
    const double bytes = ulysses_layer_all_to_all_bytes(rank_heads, plan.micro_batch, seqlen / plan.ring, plan.sp, profile.activation_bytes);
    const double passes = layers * (2.0 + recompute);
    time.ulysses_all_to_all_s = passes * ulysses_pass_s(link, bytes, plan.sp);
  }

  // Ring attention (ring-flash-attention's schedule): every forward pass (the recompute's too)
  // and the backward pass of every layer.
  if (plan.ring > 1) {
    const RingLayerPassing passing = ring_layer_passing(rank_heads, cluster, plan.micro_batch, seqlen, plan.sp, plan.ring,
                                                        profile.activation_bytes, attention_per_layer_s * attention_forward_share,
                                                        plan.cp_all_gather                           ? KvExchange::kv_megatron_all_gather
                                                        : context_parallel_all_gather(profile, plan) ? KvExchange::kv_torch_all_gather
                                                                                                     : KvExchange::kv_ring_blocks,
                                                        std::max<int64_t>(1, plan.tp));
    time.ring_exposed_s = layers * ((1.0 + recompute) * passing.forward_exposed_s + passing.backward_exposed_s);
    time.ring_final_hop_s = layers * passing.final_hop_s;
  }

  // Megatron's tensor parallelism with sequence parallelism (reference-megatron-core M1.1-M1.2): a
  // layer's forward all-gathers the norm's output before QKV and fc1 and reduce-scatters after the
  // output projection and fc2, each of the gathered [T, h] over the t ranks, on the compute stream
  // (exposed; TE's userbuffer overlap, tp_comm_overlap, is off by default and not modelled). Its
  // backward gathers the row-parallel linears' output gradients (exposed), and re-gathers the norms'
  // outputs and reduce-scatters the input gradients behind the weight- and input-gradient GEMMs
  // (hidden up to the backward's GEMM time). The recompute's forward repeats the forward's four.
  if (plan.tp > 1) {
    const Link link = link_for_group(cluster, plan.tp);
    const double gathered_bytes = as_double(plan.micro_batch) * as_double(seqlen / plan.sequence_ranks()) *
                                  as_double(model.hidden_size) * as_double(profile.activation_bytes);
    // In FP8 TE gathers the linears' inputs and the output gradients quantized, a byte an element
    // (M10.1); the reduce-scatters carry the GEMMs' bf16 outputs.
    const double all_gather_bytes = plan.fp8 ? gathered_bytes / as_double(profile.activation_bytes) : gathered_bytes;
    const double all_gather_s = link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_gather, all_gather_bytes, plan.tp, link);
    const double reduce_scatter_s =
        link.latency_us * 1e-6 + collective_seconds(Collective::collective_reduce_scatter, gathered_bytes, plan.tp, link);
    // A MoE layer's MLP runs on the sequence shard with expert tensor parallelism 1: its dispatcher's
    // TP group is the expert TP group (token_dispatcher.py L83: pg_collection.expt_tp), of one rank,
    // so it gathers nothing (dispatch_postprocess L734) and only the attention's gather and
    // reduce-scatter remain, and the shared experts' where it has them (a TP-split MLP).
    const double regions = model.is_moe() && model.shared_expert_intermediate_size == 0 ? 1.0 : 2.0;  // shared experts: an MLP's two
    // Multi-head latent attention gathers narrower inputs (M9.1): its down-projections run on the
    // sequence shard (TELinear, parallel_mode "duplicated"), and what is gathered is the q latent (or
    // the norm's output where q is projected directly), the kv latent and the shared rotary key.
    double attention_gather_s = all_gather_s;
    if (model.is_latent_attention()) {
      const ModelSpec::LatentAttention& mla = model.latent_attention;
      const double gathered_width = as_double((mla.q_lora_rank > 0 ? mla.q_lora_rank : model.hidden_size) + mla.kv_lora_rank + mla.qk_rope_head_dim);
      attention_gather_s = link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_gather,
                                                                       gathered_bytes * gathered_width / as_double(model.hidden_size), plan.tp, link);
    }
    const double gathers_s = attention_gather_s + (regions - 1.0) * all_gather_s;
    const double forward_s = gathers_s + regions * reduce_scatter_s;
    const double backward_hidden_s = gathers_s + regions * reduce_scatter_s;
    const double backward_matmul_s = time.matmul_s * 2.0 / (3.0 + recompute);  // backward's share of the GEMMs
    // A checkpointed dense MLP ("mlp" recompute) gathers and reduce-scatters once more in its rerun.
    const double mlp_rerun_s = plan.recompute_modules.mlp ? all_gather_s + reduce_scatter_s : 0.0;
    time.tensor_parallel_exposed_s = layers * ((1.0 + recompute) * forward_s + mlp_rerun_s + regions * all_gather_s) +
                                     std::max(0.0, layers * backward_hidden_s - backward_matmul_s);
  }

  // Megatron's expert parallelism (reference-megatron-core M6.4): each MoE layer's all-to-all
  // dispatcher sends a rank's T_s k routed token copies ([T/t tokens x k, h]) to the expert ranks and
  // receives as many back after the experts (token_dispatch, token_combine), the (ep - 1) / ep that
  // leave the rank over the link its ep consecutive ranks share (the expert grid etp-ep-edp-pp puts
  // them side by side); backward mirrors both, the recompute repeats the forward's. On the compute
  // stream, exposed: the dispatch waits for routing and the experts for the dispatch. The probabilities'
  // exchange ([T_s k] values) is left out beside the tokens'.
  if (plan.ep > 1 && model.is_moe()) {
    const Link link = link_for_group(cluster, plan.ep);
    const double routed_bytes = as_double(plan.micro_batch) * as_double(seqlen / plan.sequence_ranks()) / as_double(std::max<int64_t>(1, plan.tp)) *
                                as_double(model.experts_per_token) * as_double(model.hidden_size) * as_double(profile.activation_bytes);
    const double exchange_s = collective_seconds(Collective::collective_all_to_all, routed_bytes, plan.ep, link);
    // A model's dense first layers dispatch nothing: the MoE layers' share of the stage's (spread evenly).
    const double moe_share = as_double(model.moe_layers()) / as_double(model.num_layers);
    time.expert_all_to_all_s = layers * moe_share * (2.0 * (1.0 + recompute) + 2.0) * exchange_s;
  }

  // ZeRO traffic, overlapped with the layers' compute by DeepSpeed's prefetching and bucketing.
  const Link world_link = link_for_group(cluster, cluster.gpus);
  double zero_overlappable_s = 0;
  double zero_exposed_s = 0;
  // What the collectives move: weights as the layers compute with them (FSDP2's param_dtype under
  // an fp32 shard), gradients as they are reduced (its reduce_dtype).
  // QLoRA's linears gathered as their packed NF4 values (bf16 storage, half a byte a weight), the rest in the stack's dtype.
  const double weight_bytes =
      plan.qlora ? as_double(model.num_layers) * nf4_layer_bytes(model, /*double_quant=*/true).packed +
                       as_double(params.total - layer_linear_parameter_count(model)) * as_double(profile.gathered_weight_bytes_or_default())
                 : as_double(params.total) * as_double(profile.gathered_weight_bytes_or_default());
  // With LoRA only the adapters have gradients (fp32) and change at the step; the frozen base is
  // gathered all the same (Reference §12 item 12).
  const double adapters = plan.lora() ? as_double(lora_parameter_count(model, plan.lora_rank, plan.lora_all_linear)) : 0.0;
  // Under tensor and pipeline parallelism a rank's share of the parameters (1/t of its stage's, a stage
  // taken as 1/p of the model), reduced over the ranks holding the same share (data x context
  // parallel: world / (t p); reference-megatron-core M2.4).
  const int64_t share_divisor = std::max<int64_t>(1, plan.tp) * std::max<int64_t>(1, plan.pp);
  const int64_t replica_ranks = cluster.gpus / share_divisor;
  // The experts' share is 1/(ep p) of them (whole on every TP rank: expert tensor parallelism 1),
  // reduced over the ranks holding the same experts (world / (ep p)); the two groups are about as
  // large, so the reduction is priced on the dense group's ranks with the sum of the two shares.
  const double expert_parameters = as_double(model.moe_layers()) * as_double(params.per_layer_routed_experts);
  const double rank_gradient_parameters = (as_double(params.total) - expert_parameters) / as_double(share_divisor) +
                                          expert_parameters / as_double(std::max<int64_t>(1, plan.ep) * std::max<int64_t>(1, plan.pp));
  const double gradient_bytes = plan.lora() ? adapters * lora_adapter_bytes(profile, plan)
                                            : rank_gradient_parameters * as_double(profile.reduce_bytes_or_default());
  const double updated_weight_bytes = plan.lora() ? adapters * lora_adapter_bytes(profile, plan) : weight_bytes;
  const bool cpu_offload_policy = fsdp2_cpu_offload(profile, plan);
  if (plan.zero_stage == 3) {
    // Each weight gathered for forward and once more for recompute+backward (DeepSpeed keeps it
    // between the two: its reuse distance is short), gradients reduce-scattered once. Under HSDP
    // within one replica's ranks, and the reduced shard all-reduced over the replicas (F1.10).
    const int64_t shard_ranks = plan.shard_ranks(cluster.gpus);
    const Link shard_link = link_for_group(cluster, shard_ranks);
    zero_overlappable_s += 2.0 * collective_seconds(Collective::collective_all_gather, weight_bytes, shard_ranks, shard_link);
    zero_overlappable_s += collective_seconds(Collective::collective_reduce_scatter, gradient_bytes, shard_ranks, shard_link);
    if (plan.dp_replicate > 1)
      zero_overlappable_s += collective_seconds(Collective::collective_all_reduce, gradient_bytes / as_double(shard_ranks),
                                                plan.dp_replicate, world_link);
    if (cpu_offload_policy) {
      // CPUOffloadPolicy (F1.12): each unit's shard copied up before its all-gather (forward and
      // backward), its reduced gradient shard copied down, on FSDP2's side streams.
      const double shard_bytes = as_double(params.total) * as_double(profile.weight_bytes) / as_double(shard_ranks);
      zero_overlappable_s += 2.0 * pcie_seconds(shard_bytes, card.pcie_host_to_device_gbps) +
                             pcie_seconds(as_double(params.total) * as_double(profile.gradient_bytes) / as_double(shard_ranks),
                                          card.pcie_device_to_host_gbps);
    } else if (plan.offload_params) {
      zero_overlappable_s += 2.0 * pcie_seconds(weight_bytes / world, card.pcie_host_to_device_gbps);
    }
  } else if (plan.zero_stage >= 1) {
    zero_overlappable_s += collective_seconds(Collective::collective_reduce_scatter, gradient_bytes, replica_ranks, world_link);
    // Updated weights are all-gathered after the step, outside backward.
    zero_exposed_s += collective_seconds(Collective::collective_all_gather, updated_weight_bytes / as_double(share_divisor), replica_ranks, world_link);
  } else {
    // DDP all-reduces every trainable gradient (a LoRA run: the fp32 adapters' alone).
    zero_overlappable_s += collective_seconds(Collective::collective_all_reduce, gradient_bytes, replica_ranks, world_link);
  }
  // Under gradient accumulation the gathers and ZeRO-2/3's reductions recur every micro-step
  // (DeepSpeed engine.py allreduce_gradients: "ZeRO stage >= 2 communicates during non gradient
  // accumulation boundaries as well"; FSDP2 as the exports run it, sync_each_batch, and torchtitan's
  // loop); ZeRO-0/1 and DDP reduce at the boundary only (the same function; the Trainer's no_sync).
  const double micro_steps = as_double(gradient_accumulation_steps(cluster, plan));
  const double reducing_micro_steps = plan.zero_stage >= 2 ? micro_steps : 1.0;
  time.zero_communication_exposed_s = reducing_micro_steps * std::max(0.0, zero_overlappable_s - layer_compute_s) + zero_exposed_s;

  // Checkpoint offload: each layer's hidden_states go to the host in forward and come back in
  // backward. ArcticTraining copies synchronously (fully exposed); FPDT overlaps the copies with
  // the layer's compute on a side stream.
  const double a = as_double(profile.activation_bytes);
  const double local_tokens = as_double(plan.micro_batch) * as_double(seqlen / plan.sequence_ranks());
  const double x_bytes = local_tokens * as_double(model.hidden_size) * a;
  if (plan.checkpoint_offload) {
    const double copies_s =
        layers * (pcie_seconds(x_bytes, card.pcie_device_to_host_gbps) + pcie_seconds(x_bytes, card.pcie_host_to_device_gbps));
    // Unsloth copies on a side stream into double-buffered reloads (Reference §12 items 27-28):
    // overlapped, as FPDT's are.
    const bool overlapped = plan.fpdt || profile.checkpoint_offload_reload_buffers > 0;
    time.checkpoint_offload_s = overlapped ? std::max(0.0, copies_s - layer_compute_s) : copies_s;
  }

  // TE's activation offloading (M5.3): the first n layers' saved activations down in forward and up
  // in backward, on a side stream; each copy has the other L - n layers' compute to hide behind
  // (finished before layer L - n + i, reloaded from layer L - 1 - n + i on).
  if (plan.offload_activation_layers > 0) {
    double saved_bytes = 0;
    for (const MemoryItem& item : layer_saved_tensors(model, cluster, plan, profile, seqlen)) saved_bytes += item.bytes;
    const double offloaded = as_double(plan.offload_activation_layers);
    const double copies_s = offloaded * (pcie_seconds(saved_bytes, card.pcie_device_to_host_gbps) + pcie_seconds(saved_bytes, card.pcie_host_to_device_gbps));
    time.activation_offload_s = std::max(0.0, copies_s - layer_compute_s * (layers - offloaded) / layers);
  }

  // FPDT's chunk traffic over PCIe, per layer (REFERENCE §3.6). With u chunks, forward stores
  // the q, k, v, output and lse chunks and the input chunks, and fetches k/v chunk j for every
  // q chunk i >= j: u(u+1)/2 fetches of 2 K/u bytes = (u+1) K. Backward fetches q, output, lse and
  // output-gradient chunks for every (i, j >= i) step and moves fp32 dq accumulators in and out.
  // The traffic hides behind the chunk's attention compute; what exceeds it is exposed, and the
  // first chunk of every layer pass is never hidden (the pipeline fill): small chunks starve the
  // GPU, large ones lengthen the fill.
  if (plan.fpdt) {
    const double chunks = std::max(1.0, as_double(seqlen) / as_double(plan.fpdt_chunk_tokens));
    const double q_bytes = local_tokens * as_double(model.q_width()) * a;
    const double kv_bytes = local_tokens * as_double(model.kv_width() * kv_replication_factor(model, plan.sp)) * a;
    const double lse_bytes = local_tokens * as_double(model.num_q_heads) * 4.0;
    const double forward_bytes = 2.0 * q_bytes + 2.0 * kv_bytes + lse_bytes + x_bytes + (chunks + 1.0) * kv_bytes;
    const double backward_bytes = (chunks + 1.0) / 2.0 * (3.0 * q_bytes + lse_bytes) + 2.0 * (q_bytes / a * 4.0) + (chunks + 1.0) * kv_bytes;
    const double pcie_gbps = std::min(card.pcie_host_to_device_gbps, card.pcie_device_to_host_gbps);
    const double passes_forward = 1.0 + recompute;
    const double fill_s = pcie_seconds(2.0 * kv_bytes / chunks, pcie_gbps);
    const double forward_exposed =
        std::max(0.0, pcie_seconds(forward_bytes, pcie_gbps) - attention_per_layer_s * attention_forward_share) + fill_s;
    const double backward_exposed =
        std::max(0.0, pcie_seconds(backward_bytes, pcie_gbps) - attention_per_layer_s * 2.5 * attention_forward_share) + fill_s;
    time.fpdt_fetch_exposed_s = layers * (passes_forward * forward_exposed + backward_exposed);
  }

  // Optimizer step (offloaded: offloaded_optimizer_step); on the GPU an Adam pass bound by HBM
  // bandwidth (fp32 master, m, v read and written, the gradient read, the bf16 weight written).
  // (Under tensor and pipeline parallelism a rank's share, P / (t p), sharded over world / (t p) ranks: P / world alike.)
  const double optimizer_shards = plan.zero_stage >= 1 ? as_double(plan.shard_ranks(cluster.gpus)) : as_double(share_divisor);
  const double partition_params = as_double(params.total) / optimizer_shards;
  if (plan.lora() && plan.offload_optimizer) {
    // ZeRO-Offload's passes over the adapters' partition alone (the base has no optimizer state).
    const OffloadedStep step = offloaded_optimizer_step(profile, plan, card, adapters / optimizer_shards, as_double(cluster.ranks_per_node()));
    time.gradient_offload_s = step.gradient_download_s;
    time.optimizer_s = step.host_passes_s + step.weight_upload_s;
  } else if (plan.lora()) {
    // AdamW over the adapters alone, in their dtype: weight, gradient, m, v read, weight, m, v written.
    time.optimizer_s = adapters * 7.0 * lora_adapter_bytes(profile, plan) / (card.hbm_gbps * 1e9);
  } else if (cpu_offload_policy) {
    // PyTorch's AdamW on the host's fp32 shards, foreach path, op by op (torch/optim/adam.py
    // _multi_tensor_adam; weight decay, lerp of m, mul + addcmul of v, sqrt, div, add eps, addcdiv
    // of the parameter): 80 bytes of DRAM traffic a parameter [derived], every rank of the node at once.
    time.optimizer_s = as_double(params.total) / as_double(plan.shard_ranks(cluster.gpus)) * as_double(cluster.ranks_per_node()) * 80.0 /
                       (card.host_memory_gbps * profile.cpu_adam_bandwidth_efficiency * 1e9);
  } else if (plan.offload_optimizer) {
    const OffloadedStep step = offloaded_optimizer_step(profile, plan, card, partition_params, as_double(cluster.ranks_per_node()));
    time.gradient_offload_s = step.gradient_download_s;
    time.optimizer_s = step.host_passes_s + step.weight_upload_s;
  } else {
    // 8-bit AdamW reads and writes uint8 moments (2 bytes a parameter, Reference §12 item 23).
    const double state_bytes = plan.adam_8bit ? 2.0 : as_double(profile.optimizer_state_bytes);
    const double adam_bytes_per_param = 2.0 * (as_double(profile.master_weight_bytes) + state_bytes) +
                                        as_double(profile.gradient_bytes) + as_double(profile.weight_bytes);
    time.optimizer_s = partition_params * adam_bytes_per_param / (card.hbm_gbps * 1e9);
  }

  // Element-wise work (norms, RoPE, SwiGLU, residual adds; the loss's fp32 softmax read, written and
  // its gradient written, 12 bytes a logit), bound by memory bandwidth: the card's (HBM's datasheet
  // rate on a GPU; on the CPU device the rate its own kernels were measured at, elementwise_gbps).
  {
    const double tokens = as_double(plan.micro_batch) * as_double(seqlen / plan.sequence_ranks());
    const double layer_passes = 1.0 + recompute + 2.0;  // forward, recompute, backward at twice
    double bytes = tokens * (layers * layer_passes * layer_elementwise_bytes_per_token(model, profile.activation_bytes) +
                             12.0 * as_double(model.vocab_size));
    // FP8's casts (M10.1): each forward (the recompute's too) quantizes the output projection's and
    // fc2's inputs (the norms write theirs quantized), each backward its four linears' output
    // gradients, each read at the activation dtype and written as its FP8 copies; and once a step
    // every linear weight of the rank's layers (the first micro-batch's; the rest reuse the copies).
    // Bytes a cast reads and writes an element: the activation dtype's, and its FP8 copies.
    const double cast_bytes = as_double(profile.activation_bytes) + (card.fp8_transposed_copies ? 2.0 : 1.0);
    if (plan.fp8) {
      // A MoE layer's experts quantize their k routed copies of each token (M10.4), its shared experts each token.
      const double mlp_width = mlp_width_per_token(model);
      const double h = as_double(model.hidden_size);
      const double forward_elements = as_double(model.q_width()) + mlp_width;
      const double backward_elements = as_double(model.q_width() + 2 * model.kv_width()) + h +
                                       (model.mlp_kind == MlpKind::mlp_kind_swiglu ? 2.0 : 1.0) * mlp_width + h;
      bytes += tokens * layers * ((1.0 + recompute) * forward_elements + backward_elements) * cast_bytes;
    }
    const double gbps = card.elementwise_gbps > 0 ? card.elementwise_gbps : card.hbm_gbps;
    // Under tensor parallelism each rank's share: 1/t of the widths inside the attention and MLP, 1/t
    // of the tokens outside them (sequence parallelism), 1/t of the vocabulary.
    time.elementwise_s = bytes / (gbps * 1e9) / as_double(std::max<int64_t>(1, plan.tp));
    if (plan.fp8) {
      const double moe_layers = layers * as_double(model.moe_layers()) / as_double(model.num_layers);
      time.elementwise_s += te_fp8_linear_parameters(model, plan, layers - moe_layers, moe_layers) * cast_bytes / micro_steps / (gbps * 1e9);
    }
  }

  // One optimizer step: every micro-step's compute and traffic, the optimizer once. An offloaded
  // optimizer's gradients come down every micro-step where they are reduced every micro-step
  // (ZeRO-2/3 accumulate them in the host's fp32 partition), at the boundary under ZeRO-1.
  prediction.accumulation_steps = gradient_accumulation_steps(cluster, plan);
  const std::initializer_list<double*> per_micro_step_parts = {&time.matmul_s, &time.attention_s, &time.ulysses_all_to_all_s,
                                                                &time.checkpoint_offload_s, &time.fpdt_fetch_exposed_s, &time.ring_exposed_s,
                                                                &time.ring_final_hop_s, &time.tensor_parallel_exposed_s, &time.expert_all_to_all_s, &time.activation_offload_s,
                                                                &time.elementwise_s};
  double micro_batch_slot_s = 0;  // one micro-batch's forward and backward on one (pipeline stage of a) rank
  for (const double* part : per_micro_step_parts) micro_batch_slot_s += *part;
  for (double* per_micro_step : per_micro_step_parts) *per_micro_step *= micro_steps;
  if (plan.pp > 1) {
    // 1F1B (reference-megatron-core M4.1): m micro-batches through p stages take m + p - 1 slots; the
    // p - 1 beyond the micro-batches are the bubble ((p - 1) / vpp interleaved, M4.2). Each slot
    // sends the stage's output forward and receives its gradient back, [S/(u r t), b, h] under
    // sequence parallelism, between ranks t u r
    // dp apart (Megatron's rank order puts pp outermost, parallel_state.py L562): across nodes
    // once a stage's ranks fill one.
    time.pipeline_bubble_s = (pipeline_slots(cluster, plan) - micro_steps) * micro_batch_slot_s;
    const Link link = link_for_group(cluster, cluster.gpus);
    const double boundary_bytes = as_double(plan.micro_batch) * as_double(seqlen / plan.sequence_ranks()) * as_double(model.hidden_size) *
                                  as_double(profile.activation_bytes) / as_double(std::max<int64_t>(1, plan.tp));
    // Interleaved, each of a slot's vpp chunks sends its own.
    time.pipeline_p2p_s = pipeline_slots(cluster, plan) * as_double(std::max<int64_t>(1, plan.vpp)) * 2.0 *
                          (link.latency_us * 1e-6 + boundary_bytes / (link.busbw_gbps * 1e9));
  }
  time.gradient_offload_s *= reducing_micro_steps;

  const double step_s = time.total_s();
  prediction.megatron_flos = megatron_flos_per_sample(model, seqlen) * as_double(plan.micro_batch) / as_double(plan.model_parallel_ranks());
  prediction.hardware_tflops_per_gpu = micro_steps * prediction.executed_flops.total() / step_s / 1e12;
  prediction.megatron_tflops_per_gpu = micro_steps * prediction.megatron_flos / step_s / 1e12;
  prediction.mfu = micro_steps * prediction.model_flops.total() / step_s / (card.peak_bf16_tflops * 1e12);
  prediction.tokens_per_s =
      as_double(data_parallel_ranks(cluster, plan)) * micro_steps * as_double(plan.micro_batch) * as_double(seqlen) / step_s;
  return prediction;
}

double attention_benchmark_seconds(const AttentionBenchmark& benchmark, const ClusterSpec& cluster) {
  // The benchmark's heads as a model, so that the step's own rules (FLOP count, all-to-all bytes,
  // kv replication, ring passing) serve it.
  ModelSpec heads;
  heads.num_q_heads = benchmark.q_heads;
  heads.num_kv_heads = benchmark.kv_heads;
  heads.head_dim = benchmark.head_dim;
  const int64_t ranks = benchmark.sp * benchmark.ring;
  // Causal forward FLOPs shared equally by the ranks, or waiting for the plain ring's last rank.
  const double imbalance = benchmark.balanced || benchmark.ring == 1 ? 1.0 : 2.0 - 1.0 / as_double(benchmark.ring);
  const double forward_s = imbalance * layer_forward_flops(heads, benchmark.batch, benchmark.seqlen, ranks).attention /
                           (attention_tflops(cluster.hardware, benchmark.head_dim) * 1e12);
  double seconds = forward_s * (benchmark.backward ? 1.0 + 2.5 : 1.0);  // FlashAttention-2: backward = 2.5 forward
  if (benchmark.sp > 1) {
    // This Ulysses group's S / r tokens, in and out, for the forward (and the backward).
    const double bytes =
        ulysses_layer_all_to_all_bytes(heads, benchmark.batch, benchmark.seqlen / benchmark.ring, benchmark.sp, benchmark.activation_bytes);
    seconds += (benchmark.backward ? 2.0 : 1.0) * ulysses_pass_s(link_for_group(cluster, benchmark.sp), bytes, benchmark.sp);
  }
  if (benchmark.ring > 1) {
    const RingLayerPassing passing = ring_layer_passing(heads, cluster, benchmark.batch, benchmark.seqlen, benchmark.sp, benchmark.ring,
                                                        benchmark.activation_bytes, forward_s, KvExchange::kv_ring_blocks);
    seconds += passing.forward_exposed_s;
    if (benchmark.backward) seconds += passing.backward_exposed_s + passing.final_hop_s;
  }
  return seconds;
}

}  // namespace longseq
