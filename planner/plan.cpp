#include "planner/plan.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/config_error.hpp"
#include "planner/pipeline.hpp"

namespace longseq {

ClusterSpec cluster_make(const HardwareCard& hardware, int64_t gpus, int64_t nodes, int64_t gpus_per_node,
                         double host_memory_gib) {
  ClusterSpec cluster;
  cluster.hardware = hardware;
  if (gpus < 0) throw ConfigError("--gpus", "", fmt::format("must be positive, got {}", gpus));
  if (nodes < 0) throw ConfigError("--nodes", "", fmt::format("must be positive, got {}", nodes));
  if (gpus_per_node < 0) throw ConfigError("--gpus-per-node", "", fmt::format("must be positive, got {}", gpus_per_node));
  if (host_memory_gib < 0) throw ConfigError("--host-mem-gib", "", fmt::format("must be positive, got {}", host_memory_gib));
  // 2^20 GiB (1 PiB) per node is beyond any server built; larger values are typos.
  if (host_memory_gib > 1048576.0)
    throw ConfigError("--host-mem-gib", "", fmt::format("{:g} GiB is not a plausible node (at most 1048576 GiB, 1 PiB)", host_memory_gib));
  cluster.gpus_per_node = gpus_per_node > 0 ? gpus_per_node : hardware.gpus_per_node;
  cluster.host_memory_gib = host_memory_gib > 0 ? host_memory_gib : hardware.host_memory_gib;
  if (gpus > 0 && nodes > 0) {
    cluster.gpus = gpus;
    cluster.nodes = nodes;
  } else if (gpus > 0) {
    cluster.gpus = gpus;
    cluster.nodes = (gpus + cluster.gpus_per_node - 1) / cluster.gpus_per_node;
  } else {
    cluster.nodes = nodes > 0 ? nodes : 1;
    cluster.gpus = cluster.nodes * cluster.gpus_per_node;
  }
  // 2^20 GPUs is beyond any cluster built; larger values are typos.
  if (cluster.gpus > (1 << 20)) throw ConfigError("--gpus", "", fmt::format("{} GPUs is not a plausible cluster", cluster.gpus));
  if (cluster.gpus > cluster.nodes * cluster.gpus_per_node)
    throw ConfigError("--gpus", "", fmt::format("{} GPUs do not fit in {} node(s) of {} GPUs", cluster.gpus, cluster.nodes,
                                                cluster.gpus_per_node));
  if (cluster.gpus <= (cluster.nodes - 1) * cluster.gpus_per_node)
    throw ConfigError("--nodes", "", fmt::format("{} GPUs leave node(s) of {} GPUs empty across {} nodes", cluster.gpus,
                                                 cluster.gpus_per_node, cluster.nodes));
  // Across nodes every launcher (torchrun, the DeepSpeed runner, Accelerate, mpirun's ppr) starts
  // the same number of ranks on each, and the model prices every node alike: whole nodes only.
  if (cluster.nodes > 1 && cluster.gpus != cluster.nodes * cluster.gpus_per_node) {
    std::string divisors;
    for (int64_t per_node = 2; per_node < cluster.gpus_per_node; ++per_node)
      if (cluster.gpus % per_node == 0) divisors += fmt::format("{}{}", divisors.empty() ? "" : ", ", per_node);
    throw ConfigError("--gpus", "", fmt::format("{} GPUs do not fill {} nodes of {} GPUs (launchers start the same ranks on every node): "
                                                "give a multiple of {}{}", cluster.gpus, cluster.nodes, cluster.gpus_per_node,
                                                cluster.gpus_per_node,
                                                divisors.empty() ? "" : fmt::format(", or --gpus-per-node {} (whole nodes of fewer GPUs)", divisors)));
  }
  return cluster;
}

PlanOptions PlanOptions::alst(int64_t sp, int64_t gpus) {
  PlanOptions plan;
  plan.offload_params = gpus == 1;
  plan.sp = sp;
  plan.zero_stage = 3;
  plan.offload_optimizer = true;
  plan.activation_checkpointing = true;
  plan.checkpoint_offload = true;
  plan.tiled_mlp = true;
  plan.tiled_loss = true;
  return plan;
}

bool HeldChoices::lora_targets_parse(const std::string& text, const std::string& source, const std::string& key) {
  if (text != "all-linear" && text != "q,v") throw ConfigError(source, key, fmt::format("expected all-linear or q,v, got '{}'", text));
  return text == "all-linear";
}

int64_t kv_replication_factor(const ModelSpec& model, int64_t sp) {
  return sp > model.num_kv_heads ? sp / model.num_kv_heads : 1;
}

int64_t data_parallel_ranks(const ClusterSpec& cluster, const PlanOptions& plan) {
  return plan.model_parallel_ranks() > 0 ? cluster.gpus / plan.model_parallel_ranks() : 1;
}

namespace {

// Samples one micro-step takes over the cluster: a micro batch on every data-parallel rank.
int64_t samples_per_micro_step(const ClusterSpec& cluster, const PlanOptions& plan) {
  return std::max<int64_t>(1, plan.micro_batch) * std::max<int64_t>(1, data_parallel_ranks(cluster, plan));
}

}  // namespace

int64_t gradient_accumulation_steps(const ClusterSpec& cluster, const PlanOptions& plan) {
  return plan.global_batch > 0 ? std::max<int64_t>(1, plan.global_batch / samples_per_micro_step(cluster, plan)) : 1;
}

std::vector<std::string> plan_problems(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan) {
  std::vector<std::string> problems;
  // A MoE block runs outside FPDT: FPDT's layer has a dense FFN (DeepSpeed fpdt_layer.py). (Which
  // frameworks tile a MoE block is framework_unsupported's: Unsloth's whole block, item 78.)
  if (plan.qlora && !plan.lora()) problems.push_back("QLoRA trains LoRA adapters on its 4-bit base: give the adapters' rank");
  if (plan.lora()) {
    // Adapters under ZeRO (or FSDP2) and sequence parallelism: the frozen base sharded and gathered
    // like any weight, the adapters' states sharded (Reference §12 item 12). Not modelled: FPDT, and
    // a 4-bit base sharded by ZeRO-3/FSDP2 (bitsandbytes' quant_storage path) or offloaded.
    if (plan.lora_rank > 4096) problems.push_back(fmt::format("LoRA rank {} is beyond any published adapter (at most 4096)", plan.lora_rank));
    // Adapters beside ZeRO offload (DeepSpeed): the adapters' master, gradients and moments on the
    // host with the optimizer, the frozen base's bf16 partitions with the parameters. A 4-bit base
    // offloaded is not in the sources.
    if (plan.qlora && (plan.offload_optimizer || plan.offload_params))
      problems.push_back("QLoRA beside optimizer/parameter offload (bitsandbytes' 4-bit base on the host) is not modelled");
    if (plan.fpdt) problems.push_back("LoRA is planned without FPDT so far");
    if (model.is_moe()) problems.push_back(fmt::format("{}: LoRA on a mixture-of-experts model is not modelled yet", model.name));
    if (model.mlp_kind != MlpKind::mlp_kind_swiglu) problems.push_back(fmt::format("{}: LoRA is modelled on gated (SwiGLU) MLPs", model.name));
    if (plan.tiled_mlp) problems.push_back("LoRA beside TiledMLP is not modelled yet (the adapters' saved inputs per tile)");
  }
  if (plan.trl_activation_offload && !(plan.activation_checkpointing && plan.checkpoint_offload))
    problems.push_back("TRL's activation offloading is planned under checkpointing with its offload (without checkpointing it moves every "
                       "saved tensor, not modelled): add --checkpointing --checkpoint-offload");
  if (plan.moe_aux_loss && !model.is_moe())
    problems.push_back(fmt::format("{} has no experts: there is no auxiliary load-balancing loss to keep", model.name));
  if (model.is_moe() && plan.fpdt)
    problems.push_back(fmt::format("{} is a mixture-of-experts model: FPDT's layer has a dense FFN", model.name));
  if (plan.sp < 1) problems.push_back(fmt::format("sp={} must be at least 1", plan.sp));
  if (plan.sp >= 1) {
    if (plan.ring < 1) problems.push_back(fmt::format("ring={} must be at least 1", plan.ring));
    else if (cluster.gpus % plan.sequence_ranks() != 0)
      problems.push_back(plan.ring > 1 ? fmt::format("sp={} x ring={} does not divide {} GPUs (world = dp x sp x ring)", plan.sp, plan.ring,
                                                     cluster.gpus)
                                       : fmt::format("sp={} does not divide {} GPUs (world = dp x sp)", plan.sp, cluster.gpus));
    // Ulysses head rules (DS ulysses_sp.py; ALST paper §3.2.1).
    if (model.num_q_heads % plan.sp != 0)
      problems.push_back(fmt::format("sp={} does not divide {} query heads (Ulysses shards heads)", plan.sp, model.num_q_heads));
    if (model.num_kv_heads % plan.sp != 0 && plan.sp % model.num_kv_heads != 0)
      problems.push_back(fmt::format("sp={} neither divides nor is a multiple of {} key/value heads", plan.sp, model.num_kv_heads));
  }
  if (plan.tp < 1) problems.push_back(fmt::format("tp={} must be at least 1", plan.tp));
  if (plan.pp < 1) problems.push_back(fmt::format("pp={} must be at least 1", plan.pp));
  if (plan.vpp < 1) problems.push_back(fmt::format("vpp={} must be at least 1", plan.vpp));
  else if (plan.vpp > 1 && plan.pp <= 1) problems.push_back("virtual pipeline stages (vpp) interleave a pipeline: give pp > 1");
  if (plan.ep < 1) problems.push_back(fmt::format("ep={} must be at least 1", plan.ep));
  // TE's activation offloading as Megatron-Core takes it (transformer_config.py L1707-1722): fewer
  // layers than the model's, no pipeline stages, no recompute.
  if (plan.offload_activation_layers < 0)
    problems.push_back(fmt::format("--offload-activations {} must be at least 0", plan.offload_activation_layers));
  if (plan.offload_activation_layers > 0) {
    if (plan.offload_activation_layers >= model.num_layers)
      problems.push_back(fmt::format("--offload-activations {}: Megatron offloads fewer layers than the model's {}", plan.offload_activation_layers,
                                     model.num_layers));
    if (plan.activation_checkpointing)
      problems.push_back("--offload-activations runs without recompute (Megatron: \"CPU offloading does not work when activation "
                         "recomputation is enabled\"): add --no-checkpointing");
    if (plan.pp > 1) problems.push_back("--offload-activations runs without pipeline stages (Megatron refuses it with pp > 1)");
  }
  if (plan.ep > 1) {
    // Megatron's expert grid (etp-ep-edp-pp over the same world) and MoELayer's local experts:
    // num_moe_experts % ep == 0 (moe_layer.py), ep dividing a stage's ranks.
    if (!model.is_moe()) problems.push_back(fmt::format("{} has no experts to split (ep={})", model.name, plan.ep));
    else if (model.experts % plan.ep != 0)
      problems.push_back(fmt::format("ep={} does not divide {}'s {} experts", plan.ep, model.name, model.experts));
    if (plan.pp >= 1 && (cluster.gpus % plan.pp != 0 || (cluster.gpus / plan.pp) % plan.ep != 0))
      problems.push_back(fmt::format("ep={} does not divide the {} ranks of a pipeline stage", plan.ep, cluster.gpus / std::max<int64_t>(1, plan.pp)));
  }
  // Megatron's model parallelism (tensor parallelism, pipeline stages, expert parallelism) is modelled
  // as Megatron-Core runs it: its own layer and distributed optimizer, nothing of DeepSpeed's or ALST's.
  if (plan.tp >= 1 && plan.pp >= 1 && plan.ep >= 1 && (plan.tp > 1 || plan.pp > 1 || plan.ep > 1)) {
    if (plan.sp >= 1 && plan.ring >= 1 && cluster.gpus % plan.model_parallel_ranks() != 0)
      problems.push_back(fmt::format("tp={} x sp={} x ring={} x pp={} does not divide {} GPUs (world = dp x tp x sp x ring x pp)", plan.tp,
                                     plan.sp, plan.ring, plan.pp, cluster.gpus));
    if (plan.lora()) problems.push_back("LoRA beside Megatron's tensor, pipeline or expert parallelism is not modelled");
    if (plan.fpdt || plan.tiled_mlp || plan.tiled_loss || plan.checkpoint_offload || plan.offload_params || plan.offload_optimizer ||
        plan.zero_stage > 1 || plan.checkpoint_every > 1 || plan.checkpoint_ops)
      problems.push_back("Megatron's tensor, pipeline and expert parallelism are modelled as Megatron-Core runs them: its distributed optimizer "
                         "(ZeRO-1's layout) or none, full or no recompute, without FPDT, ALST's tiling and the offloads");
  }
  if (plan.tp > 1) {
    // Megatron-Core splits the query heads and the key/value groups over the TP ranks
    // (transformer/attention.py: num_attention_heads_per_partition, num_query_groups_per_partition
    // by divide(), which asserts divisibility), and Ulysses then splits a TP rank's heads.
    if (model.num_q_heads % plan.tp != 0)
      problems.push_back(fmt::format("tp={} does not divide {} query heads (Megatron splits heads over TP ranks)", plan.tp, model.num_q_heads));
    else if (plan.sp >= 1 && (model.num_q_heads / plan.tp) % plan.sp != 0)
      problems.push_back(fmt::format("sp={} does not divide the {} query heads a TP rank holds", plan.sp, model.num_q_heads / plan.tp));
    if (model.num_kv_heads % plan.tp != 0)
      problems.push_back(fmt::format("tp={} does not divide {} key/value heads (num_query_groups % tp, Megatron's divide())", plan.tp,
                                     model.num_kv_heads));
    else if (const int64_t kv_heads = model.num_kv_heads / plan.tp; plan.sp >= 1 && kv_heads % plan.sp != 0 && plan.sp % kv_heads != 0)
      problems.push_back(fmt::format("sp={} neither divides nor is a multiple of the {} key/value heads a TP rank holds", plan.sp, kv_heads));
  }
  if (plan.pp > 1) {
    // Where pp does not divide the layers, Megatron's uneven split (pipeline_split): the first and
    // last stages need a layer each, and interleaving is planned on even splits only.
    if (const PipelineSplit split = pipeline_split(model, plan); !split.even()) {
      if (split.first < 1 || split.last < 1)
        problems.push_back(fmt::format("pp={} leaves no layer to the first or last stage of {} decoder layers", plan.pp, model.num_layers));
      if (plan.vpp > 1)
        problems.push_back(fmt::format("pp={} does not divide {} decoder layers: the interleaved schedule is planned on an even split only",
                                       plan.pp, model.num_layers));
    }
    if (plan.vpp > 1) {
      // Megatron's interleaved schedule: whole chunks of layers per virtual stage (arguments.py
      // L933-941), and micro-batches in groups of pp (microbatch_group_size_per_vp_stage's default,
      // model_parallel_config.py L567-568; schedules.py L1132-1150 refuses fewer, or a remainder).
      if (model.num_layers % (plan.pp * plan.vpp) != 0)
        problems.push_back(fmt::format("pp={} x vpp={} does not divide {} decoder layers (each virtual stage holds whole layers)", plan.pp,
                                       plan.vpp, model.num_layers));
      const int64_t micro_batches = gradient_accumulation_steps(cluster, plan);
      if (micro_batches % plan.pp != 0)
        problems.push_back(fmt::format("the interleaved schedule runs micro-batches in groups of pp={}: {} micro-batches (--global-batch / "
                                       "(micro batch x dp)) are not a multiple of it", plan.pp, micro_batches));
    }
  }
  if (plan.zero_stage < 0 || plan.zero_stage > 3) problems.push_back(fmt::format("ZeRO stage {} is not 0..3", plan.zero_stage));
  if (plan.offload_optimizer && plan.zero_stage < 1)
    problems.push_back("optimizer offload needs ZeRO stage 1, 2 or 3 (DeepSpeed ZeRO-Offload)");
  if (plan.offload_params && plan.zero_stage != 3) problems.push_back("parameter offload needs ZeRO stage 3 (offload_param)");
  if (plan.checkpoint_every < 1) problems.push_back(fmt::format("checkpointing every {} layers: must be at least 1", plan.checkpoint_every));
  if (plan.checkpoint_every > 1) {
    if (!plan.activation_checkpointing) problems.push_back("checkpointing one layer in every N needs activation checkpointing");
    if (plan.checkpoint_offload) problems.push_back("checkpoint offload with one layer in every N checkpointed is not modelled");
    if (plan.fpdt) problems.push_back("FPDT checkpoints every layer (its recipe); one in every N is not modelled with it");
  }
  // Megatron's block recompute (M5.2): the first n layers of each model chunk, fewer than the chunk's
  // (as many is every layer: uniform, the default).
  if (plan.recompute_block_layers < 0)
    problems.push_back(fmt::format("--recompute-block-layers {} must be at least 0", plan.recompute_block_layers));
  if (plan.recompute_block_layers > 0) {
    if (!plan.activation_checkpointing) problems.push_back("--recompute-block-layers recomputes the first layers of a stage: it needs checkpointing");
    if (plan.checkpoint_every > 1 || plan.checkpoint_ops || plan.checkpoint_offload)
      problems.push_back("--recompute-block-layers is Megatron's full recompute of a stage's first layers: not with --checkpoint-every, "
                         "--checkpoint-ops or checkpoint offload");
    const int64_t chunk_layers = model_chunk_layers(model, plan);
    if (plan.pp >= 1 && plan.vpp >= 1 && plan.recompute_block_layers >= chunk_layers)
      problems.push_back(fmt::format("--recompute-block-layers {}: a {} holds about {} layers, and recomputing as many is every layer's "
                                     "recompute (leave the flag out)", plan.recompute_block_layers,
                                     plan.vpp > 1 ? "model chunk" : plan.pp > 1 ? "pipeline stage" : "model", chunk_layers));
  }
  // Megatron's selective recompute (M5.1): instead of full recompute, of modules the model has.
  if (plan.recompute_modules.any()) {
    if (plan.activation_checkpointing)
      problems.push_back("--recompute-modules is Megatron's selective recompute, instead of recomputing whole layers: add --no-checkpointing");
    if (plan.offload_activation_layers > 0) problems.push_back("--recompute-modules with --offload-activations is not modelled");
    if (plan.recompute_modules.layernorm && !model.is_latent_attention() && !model.is_moe())
      problems.push_back(fmt::format("--recompute-modules layernorm: {}'s layer fuses its norms into the next linear (TE's "
                                     "LayerNormColumnParallelLinear), leaving no norm output to recompute", model.name));
    if (plan.recompute_modules.moe_act && !model.is_moe())
      problems.push_back(fmt::format("--recompute-modules moe_act: {} has no experts", model.name));
    // transformer_layer.py L514-516: "mlp" checkpoints a dense layer's MLP only (recompute_mlp is not
    // set on a MoE layer; a MoE model's dense first layers are not planned apart).
    if (plan.recompute_modules.mlp && model.is_moe())
      problems.push_back(fmt::format("--recompute-modules mlp: {}'s MoE layers are not checkpointed by it (Megatron's \"moe\" module, "
                                     "not modelled)", model.name));
    if (plan.recompute_modules.mla_up_proj && !model.is_latent_attention())
      problems.push_back(fmt::format("--recompute-modules mla_up_proj: {} has no multi-head latent attention", model.name));
    if (plan.recompute_modules.mla_up_proj && (plan.sp > 1 || plan.ring > 1))
      problems.push_back("--recompute-modules mla_up_proj under context parallelism is not modelled (TE's context-parallel attention "
                         "saves its own copies of q, k and v)");
  }
  // Megatron's all_gather over the ring degree alone (cp_comm_type "all_gather"; a2a+p2p is its
  // hierarchical type, M2.2).
  if (plan.cp_all_gather && (plan.ring < 2 || plan.sp > 1))
    problems.push_back("--cp-all-gather gathers K/V over the context-parallel ranks of --ring R (R > 1), without --sp");
  // Transformer Engine's FP8 (M10): on a card with FP8 tensor cores, for the GPT and MoE layers (MLA's
  // FP8 tensors are not modelled yet).
  if (plan.fp8) {
    if (!(cluster.hardware.peak_fp8_tflops > 0))
      problems.push_back(fmt::format("--fp8: {}'s card gives no FP8 tensor rate (peak_fp8_tflops; the cards of NVIDIA's Ada, Hopper "
                                     "and Blackwell data-centre parts carry their datasheets' figure)", cluster.hardware.name));
    if (plan.recompute_modules.moe_act)
      problems.push_back("--fp8 with --recompute-modules moe_act is not modelled (fc2 saves its own quantized copy of the activation)");
    if (model.is_latent_attention())
      problems.push_back(fmt::format("--fp8 with {}'s multi-head latent attention is not modelled yet", model.name));
  }
  if (plan.checkpoint_ops) {
    if (!plan.activation_checkpointing) problems.push_back("op-level selective checkpointing needs activation checkpointing");
    if (plan.checkpoint_every > 1) problems.push_back("op-level selective checkpointing wraps every layer: not with one layer in every N");
    if (plan.checkpoint_offload) problems.push_back("checkpoint offload with op-level selective checkpointing is not modelled");
    if (plan.fpdt || plan.tiled_mlp) problems.push_back("op-level selective checkpointing is modelled without FPDT and TiledMLP");
  }
  if (plan.checkpoint_offload && !plan.activation_checkpointing)
    problems.push_back("checkpoint offload needs activation checkpointing");
  if (plan.mlp_tiles < 0) problems.push_back(fmt::format("MLP tile count {} is negative", plan.mlp_tiles));
  if (plan.loss_tiles < 0) problems.push_back(fmt::format("loss tile count {} is negative", plan.loss_tiles));
  if (plan.mlp_tiles > 0 && !plan.tiled_mlp) problems.push_back("an MLP tile count is given but tiled MLP is off");
  if (plan.loss_tiles > 0 && !plan.tiled_loss) problems.push_back("a loss tile count is given but tiled loss is off");
  if (plan.fpdt) {
    if (plan.fpdt_chunk_tokens < 1 || plan.fpdt_chunk_tokens % (plan.sp >= 1 ? plan.sp : 1) != 0)
      problems.push_back(fmt::format("FPDT chunk of {} tokens must be a positive multiple of sp={}", plan.fpdt_chunk_tokens, plan.sp));
    if (!plan.activation_checkpointing) problems.push_back("FPDT needs activation checkpointing (its recipe: --checkpoint-in-cpu)");
    if (plan.tiled_mlp || plan.tiled_loss)
      problems.push_back("FPDT chunks the MLP and the loss itself; turn tiled MLP and tiled loss off");
  }
  if (plan.ring > 1 && plan.fpdt) problems.push_back("ring attention with FPDT's chunking is not modelled");
  if (plan.micro_batch < 1) problems.push_back(fmt::format("micro batch {} must be at least 1", plan.micro_batch));
  if (plan.global_batch < 0) problems.push_back(fmt::format("global batch {} must not be negative", plan.global_batch));
  if (plan.global_batch > 0 && plan.micro_batch >= 1 && plan.tp >= 1 && plan.pp >= 1 && plan.sequence_ranks() >= 1 &&
      cluster.gpus % plan.model_parallel_ranks() == 0) {
    const int64_t per_micro_step = samples_per_micro_step(cluster, plan);
    if (plan.global_batch % per_micro_step != 0)
      problems.push_back(fmt::format("global batch {} is not a multiple of micro batch {} x dp {} = {} samples a micro-step",
                                     plan.global_batch, plan.micro_batch, data_parallel_ranks(cluster, plan), per_micro_step));
  }
  if (plan.dp_replicate < 1) {
    problems.push_back(fmt::format("dp_replicate={} must be at least 1", plan.dp_replicate));
  } else if (plan.dp_replicate > 1) {
    // HSDP's mesh (Accelerate dp_replicate x dp_shard x cp = world, F4.2; torchtitan F6.2): the
    // replicas divide the world, and each replica holds whole sequence groups.
    if (plan.zero_stage != 3) problems.push_back("dp_replicate (HSDP) replicates a fully sharded model: it needs ZeRO-3's layout (FSDP2)");
    if (cluster.gpus % plan.dp_replicate != 0)
      problems.push_back(fmt::format("dp_replicate={} does not divide {} GPUs", plan.dp_replicate, cluster.gpus));
    else if (plan.sequence_ranks() >= 1 && plan.shard_ranks(cluster.gpus) % plan.sequence_ranks() != 0)
      problems.push_back(fmt::format("dp_replicate={} leaves {} ranks a replica, not a multiple of the {} ranks a sequence spans",
                                     plan.dp_replicate, plan.shard_ranks(cluster.gpus), plan.sequence_ranks()));
  }
  return problems;
}

std::vector<std::string> seqlen_problems(const PlanOptions& plan, int64_t seqlen) {
  std::vector<std::string> problems;
  if (seqlen < 1) problems.push_back(fmt::format("sequence length {} must be positive", seqlen));
  else if (plan.sp >= 1 && plan.ring > 1 && seqlen % seqlen_granule(plan) != 0)
    problems.push_back(fmt::format("sequence length {} is not divisible by 2 x sp x ring = {} (ring attention's zigzag split: 2 x ring "
                                   "chunks, each over sp ranks)", seqlen, seqlen_granule(plan)));
  else if (plan.sp >= 1 && seqlen % plan.sp != 0)
    problems.push_back(fmt::format("sequence length {} is not divisible by sp={} (each rank holds S/sp tokens)", seqlen, plan.sp));
  else if (plan.tp > 1 && seqlen % seqlen_granule(plan) != 0)
    problems.push_back(fmt::format("sequence length {} is not divisible by {} (sequence parallelism splits each rank's tokens over tp={})",
                                   seqlen, seqlen_granule(plan), plan.tp));
  else if (plan.fpdt && plan.fpdt_chunk_tokens > 0 && seqlen % plan.fpdt_chunk_tokens != 0)
    problems.push_back(fmt::format("sequence length {} is not a multiple of the FPDT chunk of {} tokens (FPDT_InputConstruct)",
                                   seqlen, plan.fpdt_chunk_tokens));
  // A tile holds at least one token of the rank's share: more tiles than tokens would be counted
  // as fewer than given (torch.chunk returns fewer pieces), so they are refused instead.
  const int64_t local_tokens = plan.sequence_ranks() >= 1 ? seqlen / plan.sequence_ranks() : seqlen;
  if (seqlen >= 1 && plan.mlp_tiles > local_tokens)
    problems.push_back(fmt::format("{} MLP tiles are more than the {} tokens each rank holds (a tile holds at least one token)",
                                   plan.mlp_tiles, local_tokens));
  if (seqlen >= 1 && plan.loss_tiles > local_tokens)
    problems.push_back(fmt::format("{} loss tiles are more than the {} tokens each rank holds (a tile holds at least one token)",
                                   plan.loss_tiles, local_tokens));
  return problems;
}

int64_t sp_largest_valid(const ModelSpec& model, int64_t gpus) {
  for (int64_t sp = gpus; sp > 1; --sp) {
    if (gpus % sp != 0 || model.num_q_heads % sp != 0) continue;
    if (model.num_kv_heads % sp == 0 || sp % model.num_kv_heads == 0) return sp;
  }
  return 1;
}

int64_t seqlen_granule(const PlanOptions& plan) {
  if (plan.fpdt) return plan.fpdt_chunk_tokens;  // FPDT_InputConstruct: whole chunks (each a multiple of sp)
  // Megatron's sequence parallelism scatters each rank's tokens over its TP ranks
  // (gpt_model.py scatter_embedding_sequence_parallel; reference-megatron-core M1.3).
  return (plan.ring > 1 ? 2 * plan.sp * plan.ring : plan.sp) * std::max<int64_t>(1, plan.tp);
}

std::string stack_attention_kernel(const RuntimeProfile& profile, const HardwareCard& card) {
  return attention_kernel_resolve(profile.attention_kernel, card);
}

double lora_adapter_bytes(const RuntimeProfile& profile, const PlanOptions& plan) { return plan.qlora ? profile.qlora_adapter_bytes : 4.0; }

double sdpa_dense_mask_bytes(int64_t seqlen) { return static_cast<double>(seqlen) * static_cast<double>(seqlen); }

bool context_parallel_all_gather(const RuntimeProfile& profile, const PlanOptions& plan) {
  return profile.ring_implementation == RingImplementation::ring_torch_allgather && !plan.cp_all_to_all;
}

bool fsdp2_cpu_offload(const RuntimeProfile& profile, const PlanOptions& plan) {
  return plan.zero_stage == 3 && profile.parameter_sharding == ParameterSharding::sharding_fsdp2 && plan.offload_params &&
         plan.offload_optimizer;
}

std::string attention_kernel_for(const RuntimeProfile& profile, const HardwareCard& card, const PlanOptions& plan) {
  if (plan.fpdt) return "fa2";
  const std::string stack = stack_attention_kernel(profile, card);
  if (plan.ring > 1) {
    // Megatron-Core's context parallelism runs TE's own attention backend on each block (M2.3).
    if (profile.megatron_te_layer) return stack;
    if (profile.ring_implementation != RingImplementation::ring_torch_allgather) return "fa2";
    // PyTorch's context parallelism calls SDPA's kernels: a kernel outside SDPA is not called there.
    return attention_kernel_facts(stack).sdpa_backend ? stack : card.sdpa_default_backend;
  }
  return stack;
}

std::string model_parallel_describe(const PlanOptions& plan) {
  std::string text = plan.tp > 1 ? fmt::format("tp={} ", plan.tp) : std::string();
  if (plan.pp > 1) text += plan.vpp > 1 ? fmt::format("pp={} vpp={} ", plan.pp, plan.vpp) : fmt::format("pp={} ", plan.pp);
  if (plan.ep > 1) text += fmt::format("ep={} ", plan.ep);
  if (!text.empty()) text.pop_back();
  return text;
}

std::string megatron_recompute_modules_describe(const MegatronRecomputeModules& modules, const char* separator) {
  std::vector<std::string> names;
  if (modules.layernorm) names.push_back("layernorm");
  if (modules.moe_act) names.push_back("moe_act");
  if (modules.mla_up_proj) names.push_back("mla_up_proj");
  if (modules.mlp) names.push_back("mlp");
  return fmt::format("{}", fmt::join(names, separator));
}

MegatronRecomputeModules megatron_recompute_modules_parse(const std::string& text, const std::string& source, const std::string& key) {
  MegatronRecomputeModules modules;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string name = text.substr(start, end - start);
    if (name == "layernorm") modules.layernorm = true;
    else if (name == "moe_act") modules.moe_act = true;
    else if (name == "mla_up_proj") modules.mla_up_proj = true;
    else if (name == "mlp") modules.mlp = true;
    else
      throw ConfigError(source, key, fmt::format("unknown recompute module '{}' (modelled: layernorm, moe_act, mla_up_proj, mlp; Megatron's "
                                                 "core_attn, moe and shared_experts are not)", name));
    start = end + 1;
  }
  return modules;
}

std::string plan_describe(const PlanOptions& plan) {
  std::string text = model_parallel_describe(plan);
  if (!text.empty()) text += ' ';
  text += plan.ring > 1 ? fmt::format("sp={} ring={} zero={}", plan.sp, plan.ring, plan.zero_stage)
                        : fmt::format("sp={} zero={}", plan.sp, plan.zero_stage);
  if (plan.offload_optimizer) text += " +optimizer-offload";
  if (plan.offload_params) text += " +param-offload";
  text += !plan.activation_checkpointing ? " -checkpointing"
          : plan.checkpoint_ops          ? " +checkpointing(ops)"
          : plan.checkpoint_every > 1    ? fmt::format(" +checkpointing(1 in {})", plan.checkpoint_every)
          : plan.recompute_block_layers > 0 ? fmt::format(" +checkpointing(first {} of a stage)", plan.recompute_block_layers)
                                         : " +checkpointing";
  if (plan.checkpoint_offload) text += " +checkpoint-offload";
  if (plan.recompute_modules.any()) text += fmt::format(" +recompute({})", megatron_recompute_modules_describe(plan.recompute_modules));
  if (plan.offload_activation_layers > 0) text += fmt::format(" +offload-activations({})", plan.offload_activation_layers);
  if (plan.tiled_mlp) text += plan.mlp_tiles > 0 ? fmt::format(" +tiled-mlp({})", plan.mlp_tiles) : " +tiled-mlp";
  if (plan.tiled_loss) text += plan.loss_tiles > 0 ? fmt::format(" +tiled-loss({})", plan.loss_tiles) : " +tiled-loss";
  if (plan.fpdt) text += fmt::format(" +fpdt(chunk {})", plan.fpdt_chunk_tokens);
  if (plan.lora()) text += fmt::format(" +{}(r={}{})", plan.qlora ? "qlora" : "lora", plan.lora_rank, plan.lora_all_linear ? "" : ", q/v");
  if (plan.adam_8bit) text += " +adam-8bit";
  if (plan.fp8) text += " +fp8";
  if (plan.moe_aux_loss) text += " +moe-aux-loss";
  if (plan.trl_activation_offload) text += " +trl-activation-offload";
  if (plan.cp_all_to_all && plan.ring > 1) text += " cp-rotate=alltoall";
  if (plan.cp_all_gather) text += " cp-comm=all_gather";
  if (plan.dp_replicate > 1) text += fmt::format(" dp-replicate={}", plan.dp_replicate);
  if (plan.micro_batch != 1) text += fmt::format(" micro-batch={}", plan.micro_batch);
  if (plan.global_batch > 0) text += fmt::format(" global-batch={}", plan.global_batch);
  return text;
}

}  // namespace longseq
