// report.cpp: `longseq plan`'s answer as tables and JSON: the plan, its memory and time, the tensor
// inventory, the caveats, every framework side by side, other GPU counts.
#include "cli/plan/internal.hpp"

namespace longseq {

nlohmann::json plan_to_json(const PlanOptions& plan, const ClusterSpec& cluster) {
  nlohmann::json json = {{"tp", plan.tp}, {"pp", plan.pp}, {"vpp", plan.vpp}, {"ep", plan.ep}, {"sp", plan.sp}, {"ring", plan.ring}, {"dp", data_parallel_ranks(cluster, plan)}, {"zero_stage", plan.zero_stage},
                         {"offload_optimizer", plan.offload_optimizer}, {"offload_params", plan.offload_params},
                         {"activation_checkpointing", plan.activation_checkpointing}, {"checkpoint_every", plan.checkpoint_every},
                         {"checkpoint_ops", plan.checkpoint_ops}, {"recompute_block_layers", plan.recompute_block_layers},
                         {"offload_activation_layers", plan.offload_activation_layers},
                         {"recompute_modules", megatron_recompute_modules_describe(plan.recompute_modules)},
                         {"checkpoint_offload", plan.checkpoint_offload}, {"tiled_mlp", plan.tiled_mlp},
                         {"tiled_loss", plan.tiled_loss}, {"fpdt", plan.fpdt}, {"micro_batch", plan.micro_batch},
                         {"global_batch", plan.global_batch > 0 ? plan.global_batch : plan.micro_batch * data_parallel_ranks(cluster, plan)},
                         {"gradient_accumulation_steps", gradient_accumulation_steps(cluster, plan)}};
  if (plan.fpdt) json["fpdt_chunk_tokens"] = plan.fpdt_chunk_tokens;
  json["fp8"] = plan.fp8;
  json["cp_all_gather"] = plan.cp_all_gather;
  if (plan.lora()) json["lora"] = {{"rank", plan.lora_rank}, {"targets", plan.lora_all_linear ? "all-linear" : "q,v"}, {"qlora", plan.qlora}};
  json["summary"] = plan_describe(plan);
  return json;
}

// What runs out when `plan` fails at `seqlen`: the largest term that grows with the length (the
// reserve or the model states, constant in S, explain nothing about the length), e.g.
// "largest growing with the length: layer_working_set/attention.q 4.3 GiB"; or, where nothing
// grows (a plan that fails at its first tokens), the largest term, said to be constant.
std::string largest_component_describe(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                       const RuntimeProfile& profile, int64_t seqlen) {
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, seqlen);
  const int64_t shorter_seqlen = seqlen / 2 - (seqlen / 2) % seqlen_granule(plan);
  const MemoryPrediction shorter = shorter_seqlen > 0 ? memory_predict(model, cluster, plan, profile, shorter_seqlen) : MemoryPrediction{};
  auto bytes_of = [](const std::vector<MemoryItem>& items, const MemoryItem& like) {
    for (const auto& item : items)
      if (item.name == like.name && item.category == like.category) return item.bytes;
    return 0.0;
  };
  const bool gpu = !prediction.fits_gpu();
  const std::vector<MemoryItem>& items = gpu ? prediction.gpu_items : prediction.host_items;
  const MemoryItem *largest = nullptr, *largest_growing = nullptr, *largest_constant = nullptr;
  double constant_bytes = 0;
  for (const auto& item : items) {
    if (!largest || item.bytes > largest->bytes) largest = &item;
    const bool grows = shorter_seqlen > 0 && item.bytes > 1.01 * bytes_of(gpu ? shorter.gpu_items : shorter.host_items, item);
    if (grows && (!largest_growing || item.bytes > largest_growing->bytes)) largest_growing = &item;
    if (!grows) constant_bytes += item.bytes;
    if (!grows && (!largest_constant || item.bytes > largest_constant->bytes)) largest_constant = &item;
  }
  const std::string where = gpu ? "" : fmt::format("host {:.0f} of {:.0f} GiB per node; ", bytes_to_gib(prediction.host_bytes_per_node),
                                                   bytes_to_gib(prediction.host_capacity_bytes));
  // Where the terms that do not grow with the length exceed the capacity alone, no length is the
  // cause (Qwen3-30B-A3B's model states at 256 tokens, where the length's terms are MiB): the
  // largest of them is named, not a growing term of 0.0 GiB.
  const double capacity = gpu ? prediction.gpu_capacity_bytes : prediction.host_capacity_bytes;
  if (largest_growing && largest_constant && constant_bytes > capacity)
    return fmt::format("{}largest: {}/{} {:.1f} GiB, constant in the length; the terms that do not grow take {:.1f} of {:.1f} GiB alone",
                       where, largest_constant->category, largest_constant->name, bytes_to_gib(largest_constant->bytes),
                       bytes_to_gib(constant_bytes), bytes_to_gib(capacity));
  if (largest_growing)
    return fmt::format("{}largest growing with the length: {}/{} {:.1f} GiB", where, largest_growing->category, largest_growing->name,
                       bytes_to_gib(largest_growing->bytes));
  if (largest)
    return fmt::format("{}largest: {}/{} {:.1f} GiB, constant in the length", where, largest->category, largest->name,
                       bytes_to_gib(largest->bytes));
  return where.empty() ? "GPU memory" : where.substr(0, where.size() - 2);
}

// "1 token", "32.768K tokens": a length in a sentence.
std::string tokens_text(int64_t tokens) { return tokens == 1 ? "1 token" : seqlen_format(tokens) + " tokens"; }

// How a plan spreads one sequence, named as the frameworks name it.
std::string sequence_parallelism_describe(const PlanOptions& plan, const RuntimeProfile& profile) {
  if (plan.fpdt) return fmt::format("FPDT, sp={}", plan.sp);
  if (plan.ring > 1 && profile.ring_implementation == RingImplementation::ring_torch_allgather)
    return fmt::format("PyTorch CP, cp={} ({})", plan.ring, context_parallel_all_gather(profile, plan) ? "all-gather" : "all-to-all");
  if (plan.ring > 1) return plan.sp > 1 ? fmt::format("Ulysses x ring, u={} r={}", plan.sp, plan.ring) : fmt::format("ring, r={}", plan.ring);
  if (plan.sp > 1) return fmt::format("Ulysses, sp={}", plan.sp);
  return "none (data parallel)";
}

// The plan's layout in the "each framework's best" column: Megatron's model parallelism first (its
// tensor parallelism spreads the sequence too, through its sequence parallelism), then the sequence's.
std::string layout_describe(const PlanOptions& plan, const RuntimeProfile& profile) {
  const std::string model_parallel = model_parallel_describe(plan);
  if (model_parallel.empty()) return sequence_parallelism_describe(plan, profile);
  if (plan.sequence_ranks() == 1) return model_parallel;
  return model_parallel + " x " + sequence_parallelism_describe(plan, profile);
}

// Every framework's best plan on this cluster, best first, each from its own search and runtime
// profile: the side-by-side answer to "Ulysses, USP's ring or PyTorch CP?".
std::string frameworks_compared_render(std::vector<FrameworkWinner> winners, Framework searched, bool by_length, nlohmann::json& report) {
  const auto score = [&](const FrameworkWinner& w) { return framework_winner_score(w, by_length); };
  std::stable_sort(winners.begin(), winners.end(), [&](const FrameworkWinner& a, const FrameworkWinner& b) { return score(a) > score(b); });
  std::string out = "\neach framework's best here (its own search, runtime profile and precision; PREDICTIONS):\n";
  nlohmann::json compared = nlohmann::json::array();
  for (const FrameworkWinner& w : winners) {
    const std::string name = std::string(framework_name(w.framework)) + (w.framework == searched ? " *" : "");
    if (score(w) < 0) {
      out += fmt::format("  {:<20} {}{}\n", name, by_length ? "fits no length" : "does not fit",
                         w.why_none.empty() ? "" : fmt::format(" ({})", w.why_none));
      compared.push_back({{"framework", framework_name(w.framework)}, {"fits", false}, {"why", w.why_none}, {"sequence_parallelism", nullptr},
                          {"plan", nullptr}, {"max_seqlen_tokens", nullptr}, {"step_s", nullptr}, {"tokens_per_s", nullptr},
                          {"binding_constraint", nullptr}});
      continue;
    }
    const SearchCandidate& c = *w.winner;
    const std::string spread = sequence_parallelism_describe(c.plan, w.profile);
    const std::string layout = layout_describe(c.plan, w.profile);
    if (by_length)
      out += fmt::format("  {:<20} {:<32} max {:>13} tokens, {:.1f} s/step there (limited by {})\n", name, layout,
                         integer_with_commas(c.max_seqlen), c.time.time.total_s(), c.binding_constraint);
    else
      out += fmt::format("  {:<20} {:<32} {:>9.0f} tokens/s, peak {:.1f} GiB\n", name, layout, c.time.tokens_per_s,
                         bytes_to_gib(c.memory.gpu_peak_bytes));
    compared.push_back({{"framework", framework_name(w.framework)}, {"fits", true}, {"sequence_parallelism", spread},
                        {"plan", plan_describe(c.plan)}, {"max_seqlen_tokens", by_length ? nlohmann::json(c.max_seqlen) : nullptr},
                        {"step_s", c.time.time.total_s()},
                        {"tokens_per_s", c.time.tokens_per_s}, {"binding_constraint", c.binding_constraint}, {"why", nullptr}});
  }
  out += "  (* this search; --framework NAME for one of the others' full report)\n";
  report["frameworks_compared"] = compared;
  return out;
}

namespace {

// The same card and nodes with `gpus` GPUs in all: within one node, or whole nodes of the same size
// (nullopt where `gpus` is not a whole number of them).
std::optional<ClusterSpec> cluster_of_gpus(const ClusterSpec& cluster, int64_t gpus) {
  try {
    return cluster_make(cluster.hardware, gpus, 0, gpus <= cluster.gpus_per_node ? 0 : cluster.gpus_per_node, cluster.host_memory_gib);
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

}  // namespace

std::string no_fit_advice(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile, const SearchOptions& options,
                          const SearchCandidate& closest, nlohmann::json& report) {
  const bool by_length = options.objective == SearchObjective::objective_max_seqlen;
  const MemoryPrediction& memory = closest.memory;
  const bool host_binds = memory.fits_gpu() && !memory.fits_host();
  nlohmann::json no_fit = {{"closest_plan", plan_to_json(closest.plan, cluster)},
                           {"binding_resource", host_binds ? "host_memory" : "gpu_memory"},
                           {"gpu_peak_gib", bytes_to_gib(memory.gpu_peak_bytes)},
                           {"gpu_usable_gib", bytes_to_gib(memory.gpu_capacity_bytes)},
                           {"host_gib_per_node", bytes_to_gib(memory.host_bytes_per_node)},
                           {"host_capacity_gib_per_node", bytes_to_gib(memory.host_capacity_bytes)},
                           {"longest_seqlen_here", nullptr}};  // a length was asked: the longest that fits here instead
  std::string out = fmt::format("\nwhy nothing fits (PREDICTIONS): the closest plan, {}, needs {}\n", plan_describe(closest.plan),
                                host_binds ? fmt::format("{:.1f} GiB of host memory a node of {:.1f} GiB", bytes_to_gib(memory.host_bytes_per_node),
                                                         bytes_to_gib(memory.host_capacity_bytes))
                                           : fmt::format("{:.1f} GiB of GPU memory of {:.1f} GiB usable{}", bytes_to_gib(memory.gpu_peak_bytes),
                                                         bytes_to_gib(memory.gpu_capacity_bytes),
                                                         memory.fits_host() ? "" : " (and more host memory than a node has)"));
  out += "what would fit (the same search):\n";
  // Fewer tokens on these GPUs: the longest length any plan reaches.
  if (!by_length) {
    SearchOptions longest = options;
    longest.objective = SearchObjective::objective_max_seqlen;
    const SearchResult result = plan_search(model, cluster, profile, longest);
    if (const SearchCandidate* best = result.winner()) {
      out += fmt::format("  fewer tokens: at most {} tokens on these {} GPUs ({})\n", integer_with_commas(best->max_seqlen), cluster.gpus,
                         plan_describe(best->plan));
      no_fit["longest_seqlen_here"] = {{"max_seqlen_tokens", best->max_seqlen}, {"plan", plan_to_json(best->plan, cluster)}};
    } else {
      out += fmt::format("  fewer tokens: no length fits on these {} GPUs\n", cluster.gpus);
      no_fit["longest_seqlen_here"] = nullptr;
    }
  }
  // More GPUs: the first doubling on which the same search finds a plan.
  no_fit["fewest_gpus"] = nullptr;
  for (int64_t gpus = 2 * cluster.gpus; gpus <= 64 * cluster.gpus; gpus *= 2) {
    const std::optional<ClusterSpec> more = cluster_of_gpus(cluster, gpus);
    if (!more) continue;
    const SearchResult result = plan_search(model, *more, profile, options);
    if (const SearchCandidate* best = result.winner()) {
      out += fmt::format("  more GPUs: {} GPUs fit {} ({})\n", gpus,
                         by_length ? fmt::format("up to {} tokens", integer_with_commas(best->max_seqlen))
                                   : fmt::format("{} tokens", integer_with_commas(options.seqlen)),
                         plan_describe(best->plan));
      no_fit["fewest_gpus"] = {{"gpus", gpus}, {"plan", plan_to_json(best->plan, *more)}, {"seqlen_tokens", by_length ? best->max_seqlen : options.seqlen}};
      break;
    }
  }
  if (no_fit["fewest_gpus"].is_null()) out += fmt::format("  more GPUs: none up to {} GPUs of this card\n", 64 * cluster.gpus);
  report["no_fit"] = no_fit;
  return out;
}

// Other GPU counts than the one asked about, where they change the answer: the fewest GPUs that
// reach the same length (the rest only add data parallelism), a count of these GPUs that reaches
// further, and the first larger one that does. The length is set by the ranks on one sequence,
// which the heads bound (a Ulysses degree divides them): the counts tried are each valid degree
// on whole nodes (the degree itself inside one node, else its least common multiple with a node).
std::string gpu_count_advice(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile,
                             const SearchOptions& options, const SearchCandidate& winner, nlohmann::json& report) {
  std::set<int64_t> counts;
  for (int64_t degree = 1; degree <= 2 * cluster.gpus && degree <= model.num_q_heads; ++degree) {
    if (model.num_q_heads % degree != 0 || !(model.num_kv_heads % degree == 0 || degree % model.num_kv_heads == 0)) continue;
    const int64_t count = degree <= cluster.gpus_per_node ? degree : std::lcm(degree, cluster.gpus_per_node);
    if (count != cluster.gpus && count <= 2 * cluster.gpus) counts.insert(count);
  }
  counts.insert(winner.plan.sequence_ranks() <= cluster.gpus_per_node ? winner.plan.sequence_ranks()
                                                                       : std::lcm(winner.plan.sequence_ranks(), cluster.gpus_per_node));
  counts.erase(cluster.gpus);
  struct Reach {
    int64_t gpus = 0, max_seqlen = 0;
    std::string plan;
  };
  std::optional<Reach> fewest_same, further_within, further_beyond;
  const double resolution = 1 + kSearchLengthResolution;
  for (const int64_t gpus : counts) {
    const std::optional<ClusterSpec> other = cluster_of_gpus(cluster, gpus);
    if (!other) continue;
    const SearchResult result = plan_search(model, *other, profile, options);
    const SearchCandidate* best = result.winner();
    if (!best) continue;
    const Reach reach{gpus, best->max_seqlen, plan_describe(best->plan)};
    const double length = static_cast<double>(best->max_seqlen), asked = static_cast<double>(winner.max_seqlen);
    if (gpus < cluster.gpus && length * resolution >= asked && length <= asked * resolution && (!fewest_same || gpus < fewest_same->gpus))
      fewest_same = reach;
    if (gpus < cluster.gpus && length > asked * resolution && (!further_within || length > static_cast<double>(further_within->max_seqlen)))
      further_within = reach;
    if (gpus > cluster.gpus && length > 1.5 * asked && (!further_beyond || gpus < further_beyond->gpus)) further_beyond = reach;
  }
  nlohmann::json advice = nlohmann::json::array();
  std::string out;
  auto line = [&](const Reach& reach, const std::string& what) {
    out += fmt::format("  {} GPUs: {} tokens ({}) — {}\n", reach.gpus, integer_with_commas(reach.max_seqlen), reach.plan, what);
    advice.push_back({{"gpus", reach.gpus}, {"max_seqlen_tokens", reach.max_seqlen}, {"plan", reach.plan}, {"why", what}});
  };
  if (further_within)
    line(*further_within, fmt::format("{} of your {} GPUs reach further than all of them (the heads allow a larger degree there)",
                                      further_within->gpus, cluster.gpus));
  if (fewest_same)
    line(*fewest_same, fmt::format("the same length on fewer GPUs: the other {} add data parallelism (throughput), not length",
                                   cluster.gpus - fewest_same->gpus));
  if (further_beyond) line(*further_beyond, "the fewest more GPUs that reach at least 1.5 times as far");
  report["gpu_count_advice"] = advice;
  return out.empty() ? out : "\nother GPU counts (PREDICTIONS, the same search):\n" + out;
}


// --tensors: what one decoder layer saves for backward (as the plan's runtime runs it, without
// checkpointing), tensor by tensor; the JSON's "tensors" object (docs/memory-model.md: "The tensor inventory").
std::string tensor_inventory_render(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                    const RuntimeProfile& profile, int64_t seqlen, nlohmann::json& report) {
  const std::vector<MemoryItem> saved = layer_saved_tensors(model, cluster, plan, profile, seqlen);
  std::string out = fmt::format("\ntensors one decoder layer saves for backward (PREDICTED; runtime profile {}, {} tokens a rank, no "
                                "checkpointing; with it only layer.input is kept and the rest is recomputed)\n",
                                profile.name, integer_with_commas(plan.micro_batch * (seqlen / plan.sequence_ranks())));
  out += fmt::format("  {:<40} {:<20} {:>14} {:>10}\n", "tensor", "category", "bytes", "MiB");
  nlohmann::json rows = nlohmann::json::array();
  double total = 0;
  for (const MemoryItem& item : saved) {
    out += fmt::format("  {:<40} {:<20} {:>14} {:>10.2f}\n", item.name, item.category, integer_with_commas(static_cast<int64_t>(item.bytes)),
                       item.bytes / (1024.0 * 1024.0));
    rows.push_back({{"name", item.name}, {"category", item.category}, {"bytes", item.bytes}, {"count", item.count}});
    total += item.bytes;
  }
  out += fmt::format("  {:<40} {:<20} {:>14} {:>10.2f}\n", "total", "", integer_with_commas(static_cast<int64_t>(total)), total / (1024.0 * 1024.0));
  report["tensors"] = {{"schema", "longseq.tensors/1"},
                       {"tokens_per_rank", plan.micro_batch * (seqlen / plan.sequence_ranks())},
                       {"layer_saved", rows},
                       {"layer_saved_bytes", total}};
  return out;
}

void plan_json_complete(nlohmann::json& report) {
  const nlohmann::json empty_list = nlohmann::json::array();
  const std::pair<const char*, nlohmann::json> keys[] = {
      {"framework_chosen_because", nullptr}, {"seqlen", nullptr},      {"seqlen_rounded", nullptr},   {"plan", nullptr},
      {"fits_with_margin", nullptr},          {"band", nullptr},        {"max_seqlen", nullptr},       {"prediction", nullptr},
      {"time", nullptr},                      {"caveats", empty_list},  {"search", nullptr},           {"micro_batch_search", nullptr},
      {"runner_ups", empty_list},             {"alternatives", empty_list}, {"other_framework", nullptr},
      {"frameworks_compared", empty_list},    {"gpu_count_advice", empty_list}, {"no_fit", nullptr},  {"invalid", empty_list},
      {"tensors", nullptr}};
  for (const auto& [key, absent] : keys)
    if (!report.contains(key)) report[key] = absent;
}

// What an answer rests on where no published run supports it: said beside the answer, so that no
// unvalidated figure passes for a validated one (reports/validation.md holds the record).
std::vector<std::string> plan_caveats(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                      const RuntimeProfile& profile, int64_t seqlen, double predicted_step_s) {
  std::vector<std::string> caveats;
  if (profile.step_schedule == "executor") return caveats;  // longseq's own executor: measured by `longseq run`
  const std::string kernel = attention_kernel_for(profile, cluster.hardware, plan);
  if (kernel == "fa3")
    caveats.push_back("FlashAttention-3: no published long-sequence run in the record used it (all ran FlashAttention-2); its memory "
                      "and speed here come from its code and README figures, unvalidated (--attention fa2 for the validated kernel)");
  if (kernel == "sdpa-cudnn")
    caveats.push_back(fmt::format(
        "SDPA's cuDNN backend (PyTorch's default on Hopper, the hardware card's sdpa_default_backend): priced at FlashAttention-3's "
        "measured rate, with the flash backend's buffers (no cuDNN benchmark or workspace figure is in the sources); one published "
        "run (TRL's Qwen3-8B at 1M tokens) is in the record. --attention fa2 prices SDPA's flash backend (FlashAttention-2's code, "
        "{:.0f} against {:.0f} TFLOPS here)",
        attention_tflops(cluster.hardware, model.head_dim, "fa2"), attention_tflops(cluster.hardware, model.head_dim, "sdpa-cudnn")));
  if (!cluster.hardware.approximate_rates.empty()) caveats.push_back(cluster.hardware.name + ": " + cluster.hardware.approximate_rates);
  if (plan.fp8) caveats.push_back(fp8_rate_caveat(cluster.hardware));
  // The only published steps this short, the ALST paper's 32K baselines (ZeRO-3, the optimizer
  // offloaded, 1-32 GPUs), ran 5.4-17.5 s a step longer than predicted: a part no source sizes,
  // neither per parameter nor per token (reports/validation.md). The longer published steps are
  // within 25%; a step is inside that bar only if even the smallest residual is at most 25% of it.
  constexpr double kShortStepResidualSmallest_s = 5.4, kShortStepResidualLargest_s = 17.5;  // reports/validation.md
  constexpr double kValidatedStepError = 0.25;                                             // issue 41's bar
  if (predicted_step_s > 0 && predicted_step_s < kShortStepResidualSmallest_s / kValidatedStepError)
    caveats.push_back(fmt::format(
        "step time of a short step: the shortest published steps, the ALST paper's 32K baselines (12-26 s, ZeRO-3 with the "
        "optimizer offloaded), ran {:.1f}-{:.1f} s (43-66%) longer than predicted, a per-step part no source sizes "
        "(reports/validation.md); under {:.1f} s a step is within 25% only where that part is absent, and this plan {}: read its {} "
        "step, tokens/s, MFU and cost as optimistic",
        kShortStepResidualSmallest_s, kShortStepResidualLargest_s, kShortStepResidualSmallest_s / kValidatedStepError,
        plan.offload_optimizer ? "offloads the optimizer too, whose step DeepSpeed runs at about twice its modelled passes"
                               : "is not shown to be free of it",
        duration_text(predicted_step_s)));
  if (model.final_logit_softcapping > 0 && plan.tiled_loss)
    caveats.push_back(fmt::format("{} soft-caps its final logits at {:g} in its forward; a tiled loss computes the logits itself, "
                                  "and whether it caps them (a chunk's few logits-sized transients) is not priced",
                                  model.name, model.final_logit_softcapping));
  // Past the trained positions RoPE turns through angles the model never saw: the loss starts far
  // higher unless the run scales RoPE (TRL's 1M-token Qwen3 example sets YaRN and says that
  // without it the loss at 1M starts near 10.6 instead of 4.4, as issue 40 reports it).
  // A config that already scales RoPE by a factor (YaRN, linear, dynamic) keeps the original window
  // in max_position_embeddings and reaches past it by design; Llama 3.1's llama3 scaling states the
  // extended window there.
  const bool scaled_by_factor = model.rope_scaling == "yarn" || model.rope_scaling == "linear" || model.rope_scaling == "dynamic";
  if (model.max_position_embeddings > 0 && seqlen > model.max_position_embeddings && !scaled_by_factor && !model.rope_scaling.empty())
    caveats.push_back(fmt::format("{} scales RoPE ({}) to {} positions (max_position_embeddings); at {} tokens it runs past them: "
                                  "extend the scaling for the run (a larger factor) or expect a higher loss; the exports keep the "
                                  "model's scaling; memory and time are the same",
                                  model.name, model.rope_scaling, integer_with_commas(model.max_position_embeddings),
                                  integer_with_commas(seqlen)));
  else if (model.max_position_embeddings > 0 && seqlen > model.max_position_embeddings && !scaled_by_factor)
    caveats.push_back(fmt::format("{} was trained on positions up to {} (max_position_embeddings); at {} tokens RoPE runs past them: "
                                  "set RoPE scaling for the run (YaRN with factor {}, rope_scaling in the model's config) or "
                                  "expect a much higher loss; memory and time are the same",
                                  model.name, integer_with_commas(model.max_position_embeddings), integer_with_commas(seqlen),
                                  (seqlen + model.max_position_embeddings - 1) / model.max_position_embeddings));
  if (model.sliding_window > 0 && seqlen > model.sliding_window)
    caveats.push_back(fmt::format("{} attends over a sliding window of {} tokens; planned as full causal attention (a kernel that "
                                  "honours the window does less work; the saved tensors are the same)",
                                  model.name, integer_with_commas(model.sliding_window)));
  if (profile.published_runs == 0)
    caveats.push_back(fmt::format("runtime profile '{}': no published run of this stack is in the record, so it carries no calibrated "
                                  "reserve (the DeepSpeed stack's published maxima leave 8-23 GiB its sourced terms do not explain, "
                                  "REFERENCE §7.4): this length may be optimistic by that much memory", profile.name));
  else if (!profile.published_evidence.empty())
    caveats.push_back(fmt::format("runtime profile '{}': {} published runs of this stack are in the record: {}", profile.name,
                                  profile.published_runs, profile.published_evidence));
  else if (profile.published_runs == 1 && profile.calibrated_reserve_gib == 0)
    caveats.push_back(fmt::format("runtime profile '{}': one published run of this stack is in the record (its peak predicted within "
                                  "10%, reports/validation.md); no reserve is calibrated on one run, so lengths far from it may be "
                                  "optimistic by memory the sourced terms do not explain", profile.name));
  // The PyTorch-native stacks attend through SDPA (Reference §11 F3.5, F4.5, F5.4, F5.7).
  const bool sdpa_stack = profile.parameter_sharding == ParameterSharding::sharding_fsdp2;
  if (sdpa_stack && plan.ring > 1 && profile.ring_implementation == RingImplementation::ring_torch_allgather)
    caveats.push_back(fmt::format("PyTorch context parallelism attends causally over the whole sequence with no mask (its SDPA ring "
                                  "takes none, Reference §11 F2.1; Accelerate's hook drops it): packed documents attend across each "
                                  "other (TRL >= 1.13 refuses packing under CP). Planned as one sample, padded to a multiple of 2 x "
                                  "cp = {} (the head-tail split)", 2 * plan.ring));
  else if (sdpa_stack && seqlen > 0)
    caveats.push_back(fmt::format("SDPA: padding or packed samples make transformers build a dense [B, 1, S, S] bool mask ({:.1f} GiB a "
                                  "sample at this length) and leave the flash backend; planned without either (one unpadded sample)",
                                  sdpa_dense_mask_bytes(seqlen) / kBytesPerGib));
  // SDPA's flash backend takes head_dim a multiple of 8 up to 256 (aten flash_api.cpp, Reference §11
  // F3.1); past that SDPA falls to another backend, whose speed and buffers no source sizes.
  if (attention_kernel_facts(kernel).sdpa_backend && (profile.attention_kernel == "sdpa" || sdpa_stack) &&
      (model.head_dim > 256 || model.head_dim % 8 != 0))
    caveats.push_back(fmt::format("head_dim {}: SDPA's flash backend takes a multiple of 8 up to 256 (Reference §11 F3.1), so SDPA runs "
                                  "another backend here (the memory-efficient one, or cuDNN's where it takes the size); priced as {}, "
                                  "whose speed and buffers may differ",
                                  model.head_dim, attention_kernel_facts(kernel).label));
  if (model.is_moe() && profile.megatron_te_layer)
    caveats.push_back(fmt::format(
        "mixture of experts: no published long-sequence MoE run in the record; Megatron's MoE layer is priced from code reading "
        "(megatron-core 0.19.2's all-to-all dispatcher and TE's grouped experts, docs/reference-megatron-core.md M6) with routing taken "
        "as balanced (a skewed router gives its busiest expert's rank more tokens, and the dropless dispatcher then more memory), {}",
        plan.ep > 1 ? fmt::format("the experts split over ep={} ranks and their all-to-all priced on the link those ranks share", plan.ep)
                    : std::string("every rank holding every expert (ep=1)")));
  else if (model.is_moe())
    caveats.push_back(fmt::format(
        "mixture of experts: no published long-sequence MoE run in the record; its block is priced from code reading ({}, Reference "
        "§12 4.9) with routing taken as balanced (a skewed router gives its busiest expert more tokens), {} and without expert "
        "parallelism (every rank holds every expert)",
        profile.moe_experts == MoeExperts::moe_grouped_gemm    ? "one grouped GEMM over the experts: ArcticMoE"
        : profile.moe_experts == MoeExperts::moe_hf_grouped_mm ? "transformers 5's grouped_mm over the experts"
                                                               : "transformers 4's loop over the experts",
        plan.moe_aux_loss || model.output_router_logits ? "with the auxiliary loss's kept, concatenated and one-hot router logits (--moe-aux-loss)"
                          : "without the auxiliary loss's router logits (output_router_logits must stay false; --moe-aux-loss prices them)"));
  if (model.is_latent_attention() || model.dense_layers > 0 || model.moe_router_sigmoid)
    caveats.push_back(fmt::format(
        "{}: multi-head latent attention and the sigmoid group-limited router are priced from Megatron-Core's code "
        "(docs/reference-megatron-core.md M9), with no published run of them in the record; {}{}", model.name,
        model.dense_layers > 0 ? fmt::format("its {} dense first layers with their own parameters and saved tensors (a working set "
                                             "priced as a MoE layer's, the larger), ", model.dense_layers)
                               : std::string(),
        model.mtp_layers > 0 ? fmt::format("and it trains without its {} multi-token-prediction module(s) (num_nextn_predict_layers: not "
                                           "modelled; the export leaves --mtp-num-layers unset)", model.mtp_layers)
                             : std::string("and nothing it carries is left out")));
  return caveats;
}

// One plan's full report: headline, memory breakdown, time. Fills `report` for --json.
std::string plan_report(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                        const RuntimeProfile& profile, std::optional<int64_t> seqlen, const ReportContext& context, nlohmann::json& report) {
  MemoryPrediction prediction;
  std::string out;
  if (seqlen) {
    prediction = memory_predict(model, cluster, plan, profile, *seqlen);
    out += fmt::format("sequence length {} ({}): {}\n", integer_with_commas(*seqlen), seqlen_format(*seqlen),
                       prediction.fits() ? "FITS"
                       : !prediction.fits_gpu() && !prediction.fits_host() ? "does NOT fit (GPU and host memory)"
                       : !prediction.fits_gpu() ? "does NOT fit (GPU memory)" : "does NOT fit (host memory)");
    report["seqlen"] = *seqlen;
    // A fixed length carries the maximum's margin too: past the band's low end (every estimate at
    // its high end, the calibrated reserve, GPU and host memory alike) it fits only by the point
    // estimate, inside the model's uncertainty.
    if (prediction.fits()) {
      const SeqlenBand band = max_seqlen_band(model, cluster, plan, profile, seqlen_grid(plan, context.length_multiple));
      const bool with_margin = *seqlen <= band.shortest;
      if (!with_margin)
        out += fmt::format("  NO MARGIN: it fits by the point estimate only; with every estimate at its high end (and the calibrated "
                           "reserve) the longest this plan fits is {} tokens, so {} tokens is inside the prediction's uncertainty\n",
                           integer_with_commas(band.shortest), integer_with_commas(*seqlen));
      report["fits_with_margin"] = with_margin;
      report["band"] = {{"shortest_tokens", band.shortest}, {"longest_tokens", band.longest}};
    }
  } else {
    const int64_t grid = seqlen_grid(plan, context.length_multiple);
    MaxSeqlenResult result = max_seqlen_find(model, cluster, plan, profile, grid);
    const SeqlenBand band = max_seqlen_band(model, cluster, plan, profile, grid);
    // A step-time limit cuts the memory's maximum where the step grows past it.
    const int64_t memory_max = result.max_seqlen;
    bool step_limited = false;
    if (context.max_step_s > 0 && memory_max > 0 && time_predict(model, cluster, plan, profile, memory_max).time.total_s() > context.max_step_s) {
      result.max_seqlen = max_seqlen_within_step_time(model, cluster, plan, profile, grid, memory_max, context.max_step_s);
      result.binding_constraint = fmt::format("{} of {} (memory allows {} tokens)", kStepTimeLimit, duration_text(context.max_step_s),
                                              integer_with_commas(memory_max));
      result.binding_host_term.clear();
      result.at_max = memory_predict(model, cluster, plan, profile, std::max(result.max_seqlen, grid));
      step_limited = true;
    }
    prediction = result.at_max;
    if (result.max_seqlen == 0)
      out += fmt::format("maximum sequence length: none — even {} tokens exceed {}\n", grid, result.binding_constraint);
    else
      out += fmt::format("maximum sequence length: {} tokens ({}), limited by {}{}\n", integer_with_commas(result.max_seqlen),
                         seqlen_format(result.max_seqlen), result.binding_constraint,
                         result.binding_host_term.empty() ? "" : " (largest host term: " + result.binding_host_term + ")");
    if (band.longest > 0) {
      // Under a step-time limit the band is the memory maximum's: the answer is inside it or below it.
      out += fmt::format("  {}band: {} to {} ({} with every estimate at its high end and the calibrated reserve; {} with the "
                         "sourced terms alone at their low ends{})\n",
                         step_limited ? "memory " : "", seqlen_format(band.shortest), seqlen_format(band.longest),
                         seqlen_format(band.shortest), seqlen_format(band.longest),
                         step_limited ? fmt::format("; the memory's maximum is {}, and the step-time limit binds below it", seqlen_format(memory_max))
                                      : "");
      // The point estimate sits at 100% of usable memory: what to rent and train for is the band's
      // low end, which is what --emit writes unless told otherwise.
      if (band.shortest > 0 && band.shortest < result.max_seqlen)
        out += fmt::format("  to act on: {} tokens ({}), the band's low end, {:.0f}% below the point estimate, which has no margin; "
                           "--emit writes this length (--emit-length point for the other)\n",
                           integer_with_commas(band.shortest), seqlen_format(band.shortest),
                           100.0 * (1.0 - static_cast<double>(band.shortest) / static_cast<double>(result.max_seqlen)));
    }
    report["max_seqlen"] = {{"tokens", result.max_seqlen}, {"granularity", result.granularity},
                            {"band", {{"shortest_tokens", band.shortest}, {"longest_tokens", band.longest}}},
                            {"memory_max_tokens", memory_max},  // the band's point: above the answer under a step-time limit
                            {"to_act_on_tokens", band.shortest > 0 ? std::min(band.shortest, result.max_seqlen) : result.max_seqlen},
                            {"binding_constraint", result.binding_constraint}, {"binding_host_term", result.binding_host_term}};
  }
  report["prediction"] = memory_prediction_to_json(prediction);
  out += fmt::format("  at {} tokens: {} tokens per rank", integer_with_commas(prediction.seqlen),
                     integer_with_commas(prediction.local_tokens));
  if (prediction.mlp_tiles > 0) out += fmt::format("; MLP tiles {}", prediction.mlp_tiles);
  if (prediction.loss_tile_tokens > 0) out += fmt::format("; loss tiles of {} tokens", integer_with_commas(prediction.loss_tile_tokens));
  if (prediction.kv_replication > 1) out += fmt::format("; kv heads replicated x{}", prediction.kv_replication);
  if (plan.global_batch > 0 && prediction.seqlen > 0)
    out += fmt::format("\n  batch: global {} samples ({} tokens) a step = micro batch {} x dp {} x {} accumulation steps", plan.global_batch,
                       integer_with_commas(plan.global_batch * prediction.seqlen), plan.micro_batch, data_parallel_ranks(cluster, plan),
                       gradient_accumulation_steps(cluster, plan));
  out += "\n\n" + memory_table_render(prediction, cluster.ranks_per_node());
  if (context.tensors && prediction.seqlen > 0) out += tensor_inventory_render(model, cluster, plan, profile, prediction.seqlen, report);
  double predicted_step_s = 0;
  if (prediction.seqlen > 0 && prediction.fits()) {
    const TimePrediction timing = time_predict(model, cluster, plan, profile, prediction.seqlen);
    report["time"] = time_prediction_to_json(timing, context.time);
    out += "\n" + time_table_render(timing, context.time);
    predicted_step_s = timing.time.total_s();
  }
  const std::vector<std::string> caveats = plan_caveats(model, cluster, plan, profile, prediction.seqlen, predicted_step_s);
  report["caveats"] = caveats;
  if (!caveats.empty()) {
    out += "\nwithout published evidence:\n";
    for (const auto& caveat : caveats) out += "  - " + caveat + "\n";
  }
  return out;
}

}  // namespace longseq
