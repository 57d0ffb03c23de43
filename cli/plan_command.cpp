// plan_command.cpp: `longseq plan`: the command itself, from its flags (cli/plan/options.cpp) to its
// answer (cli/plan/report.cpp) or its files (cli/plan/emit.cpp).
#include "cli/commands.hpp"
#include "cli/plan/internal.hpp"

#include <iostream>

namespace longseq {

namespace {

// Every framework's own search on this cluster beside the one just made (planner/framework_choice).
struct FrameworksCompared {
  FrameworkSearches others;              // the other frameworks' searches
  std::vector<FrameworkWinner> winners;  // the searched framework's first, then the others'
};

void frameworks_compare(FrameworksCompared& compared, const PlanCommandArgs& args, const ModelSpec& model, const ClusterSpec& cluster,
                        const SearchOptions& options, Framework searched, const RuntimeProfile& profile, const SearchResult& result) {
  compared.winners = {{searched, profile, result.winner(), result.winner() ? "" : framework_refused_every_plan(result, searched)}};
  framework_searches_add(compared.others, model, cluster, options, args.profile, !args.attention.empty(), searched);
  compared.winners.insert(compared.winners.end(), compared.others.winners.begin(), compared.others.winners.end());
}

}  // namespace

int plan_command_run(const PlanCommandArgs& args) {
  const ModelSpec model = model_with_layers(model_load(args.model), args.layers);
  // This machine (--ranks, --budget-mib) or a GPU cluster (--gpu, --gpus, --nodes, ...).
  const bool machine = args.ranks || args.budget_mib;
  MachineTarget target;
  if (machine) {
    if (!args.ranks || !args.budget_mib) throw ConfigError(args.ranks ? "--ranks" : "--budget-mib", "", "--ranks and --budget-mib go together");
    if (*args.ranks < 1 || *args.ranks > 1024) throw ConfigError("--ranks", "", fmt::format("must be in [1, 1024], got {}", *args.ranks));
    if (!(*args.budget_mib > 0)) throw ConfigError("--budget-mib", "", fmt::format("must be positive, got {}", *args.budget_mib));
    if (*args.budget_mib > kMostBudgetMib)
      throw ConfigError("--budget-mib", "", fmt::format("{:g} MiB per rank is not a plausible device (at most {:.0f} MiB, 1 TiB)",
                                                        *args.budget_mib, kMostBudgetMib));
    if (args.gpus || args.nodes || args.gpus_per_node || args.host_memory_gib || !args.profile.empty() || args.gpu != "h100-sxm-80gb")
      throw ConfigError("--ranks", "", "plans for this machine's executor; drop --gpu, --gpus, --nodes, --gpus-per-node, --host-mem-gib and --profile");
    target = MachineTarget{args.device, *args.ranks, *args.budget_mib * 1024 * 1024};
    // On the CPU the arenas are this machine's memory: a budget it cannot hold plans a run that cannot start.
    if (args.device == "cpu" && static_cast<double>(*args.ranks) * target.budget_bytes > machine_memory_total_bytes())
      throw ConfigError("--budget-mib", "", fmt::format("{} rank(s) x {:g} MiB is more than this machine's {:.1f} GiB (--device cpu runs "
                                                        "here; --device cuda plans for a GPU machine)", *args.ranks, *args.budget_mib,
                                                        machine_memory_total_bytes() / kBytesPerGib));
  } else if (args.device != "cpu") {
    throw ConfigError("--device", "", "goes with --ranks and --budget-mib (planning for this machine)");
  }
  // The target framework: given, or the one whose files --emit writes (a file must hold a plan its
  // framework runs, at a length planned for it), or longseq's executor for this machine, or the default.
  const bool framework_given = args.framework.has_value(), emitting = !args.emit.empty();
  const Framework given_framework = framework_given ? framework_parse(*args.framework) : kDefaultFramework;
  const Framework emit_framework = emitting ? framework_of_export_target(args.emit) : kDefaultFramework;
  if (machine && framework_given && given_framework != Framework::framework_longseq)
    throw ConfigError("--framework", "", "planning for this machine (--ranks) plans for longseq's executor; drop --framework");
  if (machine && emitting) throw ConfigError("--emit", "", "writes a framework's files; planning for this machine (--ranks) plans "
                                                           "for longseq's executor (--plan-out writes its plan file)");
  if (framework_given && emitting && given_framework != emit_framework)
    throw ConfigError("--emit", "", fmt::format("{} writes a {} run, but the plan is made for --framework {} (what it runs, its memory, "
                                                "its lengths): drop --framework, or give --framework {}{}",
                                                args.emit, framework_name(emit_framework), framework_name(given_framework),
                                                framework_name(emit_framework),
                                                given_framework == Framework::framework_accelerate_fsdp2
                                                    ? "; --emit accelerate-fsdp2 writes TRL's SFTTrainer script beside its YAML"
                                                    : ""));
  // A held choice only one stack runs picks it when no framework is named: adapters and 8-bit Adam
  // the HF Trainer / TRL path (PEFT, bitsandbytes), CP's rotation and HSDP Accelerate's FSDP2, TE's
  // FP8 and all_gather context parallelism Megatron-Core.
  const bool trainer_choice = args.lora_rank.has_value() || args.adam_8bit || args.trl_activation_offload;
  const bool fsdp2_choice = args.cp_rotate != "allgather" || args.dp_replicate.value_or(1) > 1;
  const bool megatron_choice = args.fp8 || args.cp_all_gather;
  const Framework default_framework = emitting          ? emit_framework
                                      : trainer_choice   ? Framework::framework_hf_trainer
                                      : fsdp2_choice     ? Framework::framework_accelerate_fsdp2
                                      : megatron_choice  ? Framework::framework_megatron_core
                                                         : kDefaultFramework;
  const Framework framework = machine ? Framework::framework_longseq : framework_given ? given_framework : default_framework;
  if (args.lora_rank && emitting && !export_writes_adapters(args.emit))
    throw ConfigError("--lora", "", "adapters are planned for the HF Trainer / TRL (alone, on DeepSpeed or on FSDP2) and Unsloth: --emit hf-trainer, accelerate, accelerate-fsdp2 or unsloth writes them");
  if (args.lora_rank && args.plan_out && !machine)
    throw ConfigError("--lora", "", "a plan file with adapters is for longseq's executor: plan it for this machine (--ranks, --budget-mib)");
  // PyTorch CP's rotation exists only where PyTorch's context parallelism runs.
  if (args.cp_rotate == "alltoall" && !framework_description(framework).pytorch_context_parallelism)
    throw ConfigError("--cp-rotate", "", fmt::format("chooses PyTorch context parallelism's rotation, which {} does not run "
                                                     "(accelerate-fsdp2 and torchtitan do)", machine ? "longseq's executor" : framework_name(framework)));
  const bool framework_checked = framework_given || emitting || trainer_choice || fsdp2_choice;
  // Neither named nor implied: the search picks the framework that serves the model best (below).
  const bool framework_unnamed = !framework_checked && !machine;
  const FrameworkFacts& facts = framework_facts(framework);
  const std::string profile_name = !args.profile.empty() ? args.profile : facts.runtime_profile;
  if (machine) executor_model_check(model);  // what the executor cannot train has no plan for this machine
  RuntimeProfile profile = machine ? machine_profile(target) : framework_profile(framework, runtime_profile_load(profile_name));
  if (!args.attention.empty()) {
    if (machine) throw ConfigError("--attention", "", "planning for this machine (--ranks) plans for longseq's own attention kernel");
    profile.attention_kernel = args.attention;
  }
  if (args.host_memory_gib && !(*args.host_memory_gib > 0))
    throw ConfigError("--host-mem-gib", "", fmt::format("must be positive, got {}", *args.host_memory_gib));
  HardwareCard card = machine ? HardwareCard{} : hardware_card_load(args.gpu);
  if (args.gpu_memory_gib) {
    if (machine) throw ConfigError("--gpu-mem-gib", "", "plans for this machine's executor have its budget: --budget-mib");
    // 2^14 GiB is beyond any GPU built; larger values are typos.
    if (!(*args.gpu_memory_gib > 0 && *args.gpu_memory_gib <= 16384))
      throw ConfigError("--gpu-mem-gib", "", fmt::format("must be in (0, 16384] GiB, got {:g}", *args.gpu_memory_gib));
    card.name += fmt::format(" at {:g} GiB (--gpu-mem-gib)", *args.gpu_memory_gib);
    card.gpu_memory_gib = *args.gpu_memory_gib;
  }
  const ClusterSpec cluster =
      machine ? machine_cluster(target)
              : cluster_make(card, positive_or_default(args.gpus, "--gpus"), positive_or_default(args.nodes, "--nodes"),
                             positive_or_default(args.gpus_per_node, "--gpus-per-node"), args.host_memory_gib.value_or(0.0));
  const HardwareCard& hardware = cluster.hardware;
  if (const std::string problem = attention_kernel_problem(profile, hardware, model.head_dim); !problem.empty())
    throw ConfigError("--attention", "", problem);
  // HSDP's replicas split the world: a count that does not divide it is a typo, not a plan to search.
  if (args.dp_replicate && *args.dp_replicate < 1)  // before the division below (a 0 was SIGFPE)
    throw ConfigError("--dp-replicate", "", fmt::format("must be at least 1, got {}", *args.dp_replicate));
  if (args.dp_replicate && cluster.gpus % *args.dp_replicate != 0)
    throw ConfigError("--dp-replicate", "", fmt::format("{} replicas do not divide {} GPUs", *args.dp_replicate, cluster.gpus));
  if (args.plan_out && !args.emit.empty()) throw ConfigError("--plan-out", "", "given with --emit; write one at a time");
  if (args.json && !args.emit.empty())
    throw ConfigError("--json", "", "given with --emit: the framework's files are the output (each DeepSpeed JSON records the plan in "
                                    "its longseq_plan key); drop one of them");
  const PlanOutputs outputs = plan_outputs_check(args);  // before any work: a refusal costs nothing
  ReportContext context;
  // A search is always for a framework (the default one at least), a fixed plan only when one is named.
  context.length_multiple = framework_checked || !plan_flags_given(args) || args.search ? facts.length_multiple : 1;
  if (machine) context.length_multiple = 1;
  if (args.max_step_time) context.max_step_s = duration_parse(*args.max_step_time, "--max-step-time");
  if (args.gpu_hour_cost && !(*args.gpu_hour_cost > 0 && *args.gpu_hour_cost < 1e6))
    throw ConfigError("--gpu-hour-cost", "", fmt::format("must be a positive price below 1e6, got {}", *args.gpu_hour_cost));
  context.time = {cluster.gpus, args.gpu_hour_cost.value_or(0)};
  context.tensors = args.tensors;
  const std::optional<MicroBatchObjective> micro_batch_searched = micro_batch_objective(args);
  micro_batch_fixed(args);  // a malformed count is refused before any work
  std::optional<int64_t> seqlen;
  if (args.seqlen) seqlen = seqlen_parse(*args.seqlen, "--seqlen");
  // A framework that feeds multiples of a granule pads any other length to the next one
  // (FrameworkFacts::length_multiple): that is the length it trains, so plan it and say so.
  std::string seqlen_rounding;
  std::optional<int64_t> seqlen_requested;
  if (seqlen && context.length_multiple > 1 && *seqlen % context.length_multiple != 0) {
    seqlen_requested = seqlen;
    seqlen = (*seqlen / context.length_multiple + 1) * context.length_multiple;
    seqlen_rounding = fmt::format("--seqlen {} rounded up to {}: {} pads every batch to a multiple of {}",
                                  integer_with_commas(*seqlen_requested), integer_with_commas(*seqlen), framework_name(framework),
                                  context.length_multiple);
    // Files written for a framework carry the planned length; the note says where it came from.
    if (!args.emit.empty()) std::cerr << "longseq: note: " << seqlen_rounding << "\n";
  }

  const int64_t global_batch = global_batch_samples(args, seqlen);
  if (machine && global_batch > 0)
    throw ConfigError(args.global_batch ? "--global-batch" : "--global-batch-tokens", "",
                      "for this machine (--ranks) the executor runs one micro batch a step");

  const ParameterCount params = parameter_count(model);
  nlohmann::json report = {
      // The shape docs/json/plan.schema.json documents; a change that breaks a reader bumps it.
      {"schema_version", kPlanJsonSchemaVersion},
      {"command", "plan"},
      {"model", {{"name", model.name}, {"parameters", params.total}}},
      {"cluster",
       {{"gpu", hardware.name}, {"gpus", cluster.gpus}, {"nodes", cluster.nodes}, {"gpus_per_node", cluster.gpus_per_node},
        {"gpu_memory_gib", hardware.gpu_memory_gib}, {"host_memory_gib_per_node", cluster.host_memory_gib}}},
      {"runtime_profile", profile.name},
      // The stack's kernel on this card (an FPDT or ring plan runs FlashAttention-2's: time.attention_kernel).
      {"attention_kernel", stack_attention_kernel(profile, hardware)},
      {"framework", framework_name(framework)},
      // How the framework was decided: named (or implied by --emit and held choices), or chosen by the
      // search as the one serving the model best, with why; "default" when the default served best.
      {"framework_choice", machine                                        ? "executor"
                           : plan_flags_given(args) && !args.search && !framework_checked ? "unchecked"
                           : framework_unnamed                              ? "default"
                           : !args.framework_chosen_because.empty()         ? "chosen"
                                                                            : "named"},
  };
  if (!args.framework_chosen_because.empty()) report["framework_chosen_because"] = args.framework_chosen_because;
  if (seqlen_requested)
    report["seqlen_rounded"] = {{"requested", *seqlen_requested}, {"planned", *seqlen}, {"multiple", context.length_multiple}};
  std::string header = fmt::format("longseq plan: PREDICTIONS of the cost model (runtime profile '{}'), not measurements\n", profile.name);
  header += fmt::format("  model    {}: {} parameters (L={} h={} heads q/kv={}/{} d={} f={} V={}{})\n", model.name,
                        integer_with_commas(params.total), model.num_layers, model.hidden_size, model.num_q_heads,
                        model.num_kv_heads, model.head_dim, model.intermediate_size, model.vocab_size,
                        model.tied_embeddings ? ", tied" : "");
  if (plan_flags_given(args) && !args.search && !framework_checked && !machine)
    header += "  framework not checked (a fixed plan; --framework NAME checks that it runs there)\n";
  else {
    std::string others;  // every other framework, from the one table that lists them
    for (Framework other : frameworks_all())
      if (other != kDefaultFramework) others += fmt::format("{}{}", others.empty() ? "" : ", ", framework_name(other));
    header += fmt::format("  framework {}{}\n", framework_name(framework),
                          !args.framework_chosen_because.empty() ? fmt::format(" ({}; --framework NAME for another)", args.framework_chosen_because)
                          : framework_given || machine ? "" : emitting ? " (the --emit target's)"
                          : args.lora_rank ? " (where adapters are planned: PEFT through the HF Trainer / TRL)"
                          : args.adam_8bit ? " (where 8-bit AdamW is planned: the HF Trainer / TRL)"
                          : fsdp2_choice   ? " (PyTorch FSDP2's: --cp-rotate / --dp-replicate)"
                          : megatron_choice ? " (Transformer Engine's FP8 and all_gather context parallelism are planned for Megatron-Core)"
                                           : fmt::format(" (the default; --framework {})", others));
  }
  header += fmt::format("  cluster  {} x {} ({:.2f} GiB each), {} node(s) of {} GPUs, {:.0f} GiB host memory per node\n",
                        cluster.gpus, hardware.name, hardware.gpu_memory_gib, cluster.nodes, cluster.gpus_per_node,
                        cluster.host_memory_gib);
  if (!seqlen_rounding.empty()) header += "  length   " + seqlen_rounding + "\n";
  if (!machine) {
    const std::string kernel = stack_attention_kernel(profile, hardware);
    const char* source = !args.attention.empty()          ? "--attention"
                         : profile.attention_kernel.empty() ? "the card's default"
                                                            : "the runtime profile's";
    // Megatron-Core runs TE's attention backend on its context-parallel blocks too (no FPDT, no USP).
    if (profile.megatron_te_layer)
      header += fmt::format("  attention {} ({}; the rate of Transformer Engine's backend on this GPU, FusedAttention on Hopper and later, "
                            "FlashAttention before; its context parallelism runs it too)\n", attention_kernel_facts(kernel).label, source);
    else
      header += fmt::format("  attention {} ({}{}; FPDT and USP's ring run FlashAttention-2{})\n", attention_kernel_facts(kernel).label, source,
                            profile.attention_kernel == "sdpa" ? ", SDPA's default on this GPU" : "",
                            profile.ring_implementation == RingImplementation::ring_torch_allgather && !attention_kernel_facts(kernel).sdpa_backend
                                ? ", PyTorch's context parallelism SDPA's default"
                                : "");
  }

  const bool fixed_plan = plan_flags_given(args);
  // --search with plan flags: the flags constrain the search instead of fixing the plan.
  if (args.search && (args.alst || args.baseline))
    throw ConfigError(args.alst ? "--alst" : "--baseline", "", "is a whole plan; with --search give the options to hold (--zero 2, --no-offload-params, ...)");
  if (args.search && (args.mlp_tiles || args.loss_tiles))
    throw ConfigError(args.mlp_tiles ? "--mlp-tiles" : "--loss-tiles", "", "the search takes each framework's tile rule; drop it or fix the plan");
  if (!args.objective.empty() && fixed_plan) throw ConfigError("--objective", "", "applies to the search; drop the plan flags");

  if (fixed_plan && !args.search) {
    if (micro_batch_searched)
      throw ConfigError("--micro-batch", "", fmt::format("{} is searched, and the plan flags fix the plan: add --search to hold them "
                                                         "while the micro batch is searched, or give a count", args.micro_batch));
    PlanOptions plan = plan_from_flags(args, model, cluster);
    plan.global_batch = global_batch;
    // --alst (or --baseline) asks for its whole set: refused by name where the framework lacks a part.
    if (framework_checked && !machine && !args.alst && !args.baseline) plan_defaults_fit(args, plan, framework, model);
    std::vector<std::string> problems = plan_problems(model, cluster, plan);
    if (framework_checked) {  // a plan for a named framework (or its files) must be one it runs
      const std::string unsupported = framework_unsupported(framework, model, plan, cluster.gpus);
      if (!unsupported.empty()) problems.push_back(unsupported);
    }
    const int64_t length_multiple = context.length_multiple;
    if (seqlen)
      for (auto& problem : seqlen_problems(plan, *seqlen)) problems.push_back(problem);
    if (!problems.empty()) throw ConfigError("plan", "", problems_join(problems));
    if (!args.emit.empty())
      return plan_emit(args, outputs, model, plan, cluster, profile, plan_seqlen(model, cluster, plan, profile, seqlen, context),
                       seqlen.has_value(), seqlen_grid(plan, length_multiple));
    report["plan"] = plan_to_json(plan, cluster);
    const std::string body = plan_report(model, cluster, plan, profile, seqlen, context, report);
    if (machine && !executor_plan_problems(plan, args.device).empty())
      throw ConfigError("plan", "", executor_plan_problems(plan, args.device).front());
    if (outputs.plan_out)
      plan_out_write(args, *outputs.plan_out, model, cluster, profile, plan,
                     seqlen ? *seqlen : report["max_seqlen"]["tokens"].get<int64_t>(), machine);
    if (args.json) {
      plan_json_complete(report);
      std::cout << json_text(report) << "\n";
      return 0;
    }
    std::cout << header << fmt::format("  plan     {} (dp={})\n\n", plan_describe(plan), data_parallel_ranks(cluster, plan)) << body;
    return 0;
  }

  SearchOptions options;
  if (args.objective.empty()) options.objective = seqlen ? SearchObjective::objective_throughput : SearchObjective::objective_max_seqlen;
  else if (args.objective == "max-seqlen") options.objective = SearchObjective::objective_max_seqlen;
  else if (args.objective == "throughput") options.objective = SearchObjective::objective_throughput;
  else throw ConfigError("--objective", "", fmt::format("expected max-seqlen or throughput, got '{}'", args.objective));
  if (options.objective == SearchObjective::objective_throughput && !seqlen)
    throw ConfigError("--objective", "", "throughput needs --seqlen (the length to maximize tokens/s at)");
  if (options.objective == SearchObjective::objective_max_seqlen && seqlen)
    throw ConfigError("--seqlen", "", "the max-seqlen objective finds the length itself; drop --seqlen or use --objective throughput");
  if (seqlen) options.seqlen = *seqlen;
  if (micro_batch_searched && !seqlen)
    throw ConfigError("--micro-batch", "", fmt::format("{} searches the micro batch at a length: give --seqlen", args.micro_batch));
  if (machine && args.micro_batch != "1")
    throw ConfigError("--micro-batch", "", "for this machine (--ranks) the search plans what run --auto runs: micro batch 1");
  // For this machine, the search `longseq run --auto` runs: what the executor runs, FPDT chunks
  // at its scale.
  if (machine && options.objective != SearchObjective::objective_max_seqlen)
    throw ConfigError("--objective", "", "for this machine (--ranks) the search finds the longest sequence, as run --auto does");
  if (!machine) {
    search_options_for_framework(options, framework, model, cluster);
  }
  if (context.max_step_s > 0 && options.objective != SearchObjective::objective_max_seqlen)
    throw ConfigError("--max-step-time", "", "limits the longest-sequence search; with --seqlen the step time is an answer, not a limit");
  options.max_step_s = context.max_step_s;
  held_choices_apply(args, options.held);
  options.held.global_batch = global_batch;
  if (args.search && fixed_plan) options.admits = search_constraints(args);
  std::optional<MicroBatchSearch> micro_batches;
  if (micro_batch_searched && !machine) {
    micro_batches = micro_batch_search(model, cluster, profile, options, *micro_batch_searched);
    // The micro batch found is held from here on: the other frameworks are compared at it.
    options.held.micro_batch = std::max<int64_t>(1, micro_batches->micro_batch);
  }
  const SearchResult result = machine          ? machine_plan_search(model, target, options.held)
                              : micro_batches ? std::move(micro_batches->result)
                                              : plan_search(model, cluster, profile, options);
  const bool by_length = options.objective == SearchObjective::objective_max_seqlen;

  int64_t invalid = 0;
  std::vector<std::pair<std::string, int64_t>> reasons;
  for (const auto& candidate : result.candidates) {
    if (candidate.problems.empty()) continue;
    ++invalid;
    auto found = std::find_if(reasons.begin(), reasons.end(), [&](const auto& r) { return r.first == candidate.problems.front(); });
    if (found == reasons.end()) reasons.emplace_back(candidate.problems.front(), 1);
    else ++found->second;
  }
  std::string out = header + fmt::format("\nsearched {} plans ({} predicted, {}{} invalid) in {:.1f} ms; objective: {}\n\n",
                                         result.candidates.size(), result.evaluated,
                                         result.pruned > 0 ? fmt::format("{} shorter than the best six at one probe, ", result.pruned) : "",
                                         invalid, result.elapsed_ms,
                                         by_length ? "the longest sequence (lengths within 0.1% tie: the faster plan, then Ulysses inside a node)" : fmt::format("tokens/s at {} tokens (plans that fit with every estimate at its high end first)", integer_with_commas(options.seqlen)));
  report["search"] = {{"objective", by_length ? "max-seqlen" : "throughput"}, {"plans", result.candidates.size()},
                      {"predicted", result.evaluated}, {"pruned", result.pruned}, {"invalid", invalid}, {"elapsed_ms", result.elapsed_ms}};
  if (micro_batches) {
    // Each micro batch tried, with its best plan's tokens/s or what its closest plan runs out of.
    const bool largest = *micro_batch_searched == MicroBatchObjective::micro_batch_largest;
    std::string tried_text;
    nlohmann::json tried_json = nlohmann::json::array();
    for (const MicroBatchTried& tried : micro_batches->tried) {
      tried_text += fmt::format("{}    {:>7}  ", tried_text.empty() ? "" : "\n", tried.micro_batch);
      tried_text += tried.fits ? fmt::format("{:>9.0f} tokens/s, peak {:.1f} GiB", tried.tokens_per_s, bytes_to_gib(tried.gpu_peak_bytes))
                               : fmt::format("does not fit ({})", tried.binding_constraint);
      tried_json.push_back({{"micro_batch", tried.micro_batch}, {"fits", tried.fits}, {"tokens_per_s", tried.tokens_per_s},
                            {"gpu_peak_gib", bytes_to_gib(tried.gpu_peak_bytes)}, {"binding_constraint", tried.binding_constraint}});
    }
    out += fmt::format("micro batch ({}): {}\n  micro batch  best plan{}\n{}\n\n",
                       largest ? "the largest whose best plan fits" : "the most tokens/s, ties to the smaller",
                       micro_batches->micro_batch > 0 ? std::to_string(micro_batches->micro_batch) : "none fits",
                       global_batch > 0 ? fmt::format(" (divisors of the global batch {})", global_batch) : "", tried_text);
    report["micro_batch_search"] = {{"objective", largest ? "max" : "fastest"}, {"micro_batch", micro_batches->micro_batch},
                                    {"tried", tried_json}};
  }
  const SearchCandidate* winner = result.winner();
  // Every other framework's best here, for the table and the choice below.
  FrameworksCompared compared;
  if (!machine) frameworks_compare(compared, args, model, cluster, options, framework, profile, result);
  // With no framework named, the plan is for the framework that serves this model best (issue 41:
  // the default's ZeRO-2-only MoE path reached 10K tokens where others reach millions): the same
  // command for that framework, the header saying why it was chosen.
  if (framework_unnamed) {
    const FrameworkWinner* best = framework_best(compared.winners, framework, by_length);
    if (best && best->framework != framework) {
      const FrameworkWinner& searched = compared.winners.front();
      const std::string default_did =
          !searched.winner ? (by_length ? "fits no length" : "does not fit at it")
          : by_length      ? fmt::format("reaches {} tokens", integer_with_commas(searched.winner->max_seqlen))
                           : fmt::format("runs {} tokens/s", integer_with_commas(std::llround(searched.winner->time.tokens_per_s)));
      PlanCommandArgs chosen = args;
      chosen.framework = framework_name(best->framework);
      chosen.framework_chosen_because =
          fmt::format("chosen: {} among the frameworks compared below; the default, {}, {}", by_length ? "the longest" : "the most tokens/s at this length",
                      framework_name(framework), default_did);
      return plan_command_run(chosen);
    }
  }
  // Why nothing fits, for a refusal that says what to change: the closest valid plan's limit, or
  // (every plan invalid) the commonest reason, e.g. a length no chunk or degree divides.
  // With --max-step-time, a plan whose memory fits but whose step is over the limit at every
  // length: the fastest of them (at its shortest length) is the closest, and the limit the reason.
  const SearchCandidate* step_limited = nullptr;
  double step_limited_s = 0;
  for (const SearchCandidate& candidate : result.candidates)
    if (candidate.problems.empty() && candidate.binding_constraint == std::string(kStepTimeLimit)) {
      const int64_t shortest = seqlen_grid(candidate.plan, options.length_multiple);
      const double step_s = time_predict(model, cluster, candidate.plan, profile, shortest).time.total_s();
      if (!step_limited || step_s < step_limited_s) step_limited = &candidate, step_limited_s = step_s;
    }
  auto no_plan_reason = [&] {
    if (step_limited)
      return fmt::format("no plan fits: every plan whose memory fits takes longer than --max-step-time ({:.3g} s) a step at any length; "
                         "the fastest, {}, takes {} at its shortest length ({})", options.max_step_s,
                         plan_describe(step_limited->plan), duration_text(step_limited_s),
                         tokens_text(seqlen_grid(step_limited->plan, options.length_multiple)));
    const bool any_valid = !result.candidates.empty() && result.candidates.front().problems.empty();
    if (any_valid)
      return fmt::format("no plan fits{}: the closest, {}, runs out of {}", seqlen ? " at " + integer_with_commas(*seqlen) + " tokens" : "",
                         plan_describe(result.candidates.front().plan), result.candidates.front().binding_constraint);
    // Every plan invalid: a reason that only excludes a degree the framework lacks (its ring, its
    // Ulysses, FPDT) is not why nothing fits. The reasons that remain once a plan's sequence-parallel
    // degrees are off are the nearest plans' (a length off the framework's grid, a model it cannot
    // build); the commonest of those is named, else the commonest of all.
    std::vector<std::pair<std::string, int64_t>> remaining;
    if (!machine)
      for (const SearchCandidate& candidate : result.candidates) {
        PlanOptions nearest = candidate.plan;
        nearest.sp = nearest.ring = 1;
        nearest.fpdt = false;
        const std::vector<std::string> problems = plan_search_problems(model, cluster, nearest, options);
        if (problems.empty()) continue;
        auto found = std::find_if(remaining.begin(), remaining.end(), [&](const auto& r) { return r.first == problems.front(); });
        if (found == remaining.end()) remaining.emplace_back(problems.front(), 1);
        else ++found->second;
      }
    auto by_count = [](const auto& a, const auto& b) { return a.second < b.second; };
    if (const auto decisive = std::max_element(remaining.begin(), remaining.end(), by_count); decisive != remaining.end())
      return decisive->second == static_cast<int64_t>(result.candidates.size())
                 ? fmt::format("no plan fits: every plan is invalid because {}", decisive->first)
                 : fmt::format("no plan fits: every plan is invalid; {} of {} are still invalid without Ulysses, ring or FPDT, because {}",
                               decisive->second, result.candidates.size(), decisive->first);
    const auto commonest = std::max_element(reasons.begin(), reasons.end(), by_count);
    return commonest == reasons.end() ? std::string("no plan fits")
                                      : fmt::format("no plan fits: every plan is invalid, {} of {} because {}", commonest->second,
                                                    result.candidates.size(), commonest->first);
  };
  if (!winner && !args.emit.empty()) throw ConfigError("--emit", "", no_plan_reason() + "; there is nothing to emit");
  if (!winner && args.plan_out) throw ConfigError("--plan-out", "", no_plan_reason() + "; there is nothing to write");
  if (!winner) {
    const SearchCandidate* best = result.candidates.empty() || !result.candidates.front().problems.empty() ? nullptr : &result.candidates.front();
    if (step_limited) out += no_plan_reason();
    else out += "no plan fits";
    if (best && !step_limited) out += fmt::format(" (closest: {}, {})", plan_describe(best->plan), best->binding_constraint);
    out += "\n";
    if (best && !step_limited && !machine) out += no_fit_advice(model, cluster, profile, options, *best, report);
    if (!machine) out += frameworks_compared_render(compared.winners, framework, by_length, report);
  } else {
    if (!args.emit.empty())
      return plan_emit(args, outputs, model, winner->plan, cluster, profile, by_length ? winner->max_seqlen : options.seqlen, !by_length,
                       seqlen_grid(winner->plan, options.length_multiple));
    if (outputs.plan_out)
      plan_out_write(args, *outputs.plan_out, model, cluster, profile, winner->plan, by_length ? winner->max_seqlen : options.seqlen,
                     machine);
    report["plan"] = plan_to_json(winner->plan, cluster);
    out += fmt::format("best plan: {} (dp={})\n", plan_describe(winner->plan), data_parallel_ranks(cluster, winner->plan));
    out += plan_report(model, cluster, winner->plan, profile, by_length ? std::nullopt : seqlen, context, report);

    auto candidate_line = [&](const SearchCandidate& c) {
      if (!c.fits)
        return fmt::format("{} ({})", by_length ? "fits no length" : "does not fit", c.binding_constraint);
      if (by_length)
        return fmt::format("max {:>11} tokens, {:.1f} s/step there", integer_with_commas(c.max_seqlen), c.time.time.total_s());
      return fmt::format("{:>9.0f} tokens/s, peak {:.1f} GiB", c.time.tokens_per_s, bytes_to_gib(c.memory.gpu_peak_bytes));
    };
    out += "\nrunner-ups:\n";
    nlohmann::json runner_ups = nlohmann::json::array();
    for (size_t i = 1; i < result.candidates.size() && i <= 5; ++i) {
      const SearchCandidate& c = result.candidates[i];
      if (!c.problems.empty() || !c.fits) break;
      out += fmt::format("  {}. {:<78} {}\n", i + 1, plan_describe(c.plan), candidate_line(c));
      runner_ups.push_back({{"plan", plan_to_json(c.plan, cluster)}, {"max_seqlen_tokens", by_length ? nlohmann::json(c.max_seqlen) : nullptr},
                            {"step_s", c.time.time.total_s()}, {"tokens_per_s", c.time.tokens_per_s}});
    }
    report["runner_ups"] = runner_ups;

    out += "\nwhy not (the best plan with one thing changed):\n";
    nlohmann::json alternatives = nlohmann::json::array();
    // Invalid (u, r) pairs refused for one reason (a framework without ring attention) are one
    // line in the text, with how many there are; the JSON keeps every one.
    std::map<std::string, int64_t> degree_pairs_refused;
    // Each alternative in the JSON: its outcome as numbers, and the line's text without the
    // table's padding.
    auto alternative_json = [&](const std::string& change, const SearchCandidate& c, const std::string& why) {
      std::string text;
      for (char ch : why)
        if (!(ch == ' ' && !text.empty() && text.back() == ' ')) text += ch;
      const bool valid = c.problems.empty();
      return nlohmann::json{{"change", change},
                            {"plan", plan_to_json(c.plan, cluster)},
                            {"outcome", text},
                            {"invalid_because", valid ? nlohmann::json(nullptr) : nlohmann::json(c.problems.front())},
                            {"fits", valid && c.fits},
                            {"max_seqlen_tokens", valid && by_length ? nlohmann::json(c.max_seqlen) : nullptr},
                            {"step_s", valid && c.fits ? nlohmann::json(c.time.time.total_s()) : nullptr},
                            {"tokens_per_s", valid && c.fits ? nlohmann::json(c.time.tokens_per_s) : nullptr},
                            {"binding_constraint", valid ? nlohmann::json(c.binding_constraint) : nullptr}};
    };
    for (const auto& alternative : search_notable_alternatives(result)) {
      const SearchCandidate& c = *alternative.candidate;
      std::string why;
      if (!c.problems.empty()) {
        why = "invalid: " + c.problems.front();
        if (c.plan.ring > 1 && degree_pairs_refused[why]++ > 0) {
          alternatives.push_back(alternative_json(alternative.change, c, why));
          continue;
        }
      } else {
        const int64_t failing = by_length ? c.max_seqlen + seqlen_grid(c.plan, options.length_multiple) : options.seqlen;
        why = candidate_line(c);
        if (c.binding_constraint == kStepTimeLimit)
          why += fmt::format("; at {} the step takes longer than {}", tokens_text(failing), duration_text(options.max_step_s));
        else if (!c.fits || by_length)
          why += fmt::format("; at {} {} runs out ({})", tokens_text(failing), c.binding_constraint,
                             largest_component_describe(model, cluster, c.plan, profile, failing));
      }
      out += fmt::format("  {:<44} {}\n", alternative.change, why);
      alternatives.push_back(alternative_json(alternative.change, c, why));
    }
    for (const auto& [why, count] : degree_pairs_refused)
      if (count > 1) out += fmt::format("  {:<44} {}\n", fmt::format("(and {} more sp x ring pairs)", count - 1), why);
    report["alternatives"] = alternatives;
    // A better plan another framework runs: each framework's own search, priced with its own
    // runtime profile (its precision, its MoE block, its buffers) at the lengths it feeds.
    if (!machine) {
      const FrameworkWinner* best = framework_best(compared.winners, framework, by_length);
      if (best && best->framework != framework) {
        const SearchCandidate& other = *best->winner;
        const std::string reach = by_length ? fmt::format("would reach {} tokens", seqlen_format(other.max_seqlen))
                                            : fmt::format("would run {:.0f} tokens/s", other.time.tokens_per_s);
        const std::string why_not_here = framework_unsupported(framework, model, other.plan);
        out += fmt::format("\nin another framework: --framework {}: {} {}{}\n", framework_name(best->framework), plan_describe(other.plan), reach,
                           why_not_here.empty() ? " (priced with its own runtime profile)" : fmt::format(" ({})", why_not_here));
        report["other_framework"] = {{"framework", framework_name(best->framework)}, {"plan", plan_to_json(other.plan, cluster)},
                                     {"max_seqlen_tokens", by_length ? nlohmann::json(other.max_seqlen) : nullptr}, {"tokens_per_s", other.time.tokens_per_s},
                                     {"why_not_here", why_not_here}};
      }
      out += frameworks_compared_render(compared.winners, framework, by_length, report);
      if (by_length) out += gpu_count_advice(model, cluster, profile, options, *winner, report);
    }
  }
  if (!reasons.empty()) {
    out += "\ninvalid plans (not predicted):\n";
    nlohmann::json invalid_json = nlohmann::json::array();
    for (const auto& [reason, count] : reasons) {
      out += fmt::format("  {:>4} x {}\n", count, reason);
      invalid_json.push_back({{"reason", reason}, {"plans", count}});
    }
    report["invalid"] = invalid_json;
  }
  plan_json_complete(report);
  if (args.json) std::cout << json_text(report) << "\n";
  else std::cout << out;
  return 0;
}

}  // namespace longseq
