// emit.cpp: what `longseq plan` writes: a framework's files (--emit), a plan file (--plan-out), and
// the checks of those outputs before any work.
#include "cli/plan/internal.hpp"

namespace longseq {

int plan_emit(const PlanCommandArgs& args, const PlanOutputs& outputs, const ModelSpec& model, const PlanOptions& plan,
              const ClusterSpec& cluster, const RuntimeProfile& profile, int64_t seqlen, bool seqlen_given, int64_t grid) {
  if (seqlen <= 0) throw ConfigError("--emit", "", "no sequence length fits this plan, so there is nothing to emit");
  std::string seqlen_basis = seqlen_given ? "as given" : "the point estimate of the maximum, at 100% of usable memory (--emit-length point)";
  if (!seqlen_given) {
    const int64_t shortest = max_seqlen_band(model, cluster, plan, profile, grid).shortest;
    // A band reaching 0: with every estimate at its high end no length fits, so the plan may not
    // run at all. Nothing is written unless the user asks for the point estimate by name.
    if (shortest == 0 && args.emit_length == "safe")
      throw ConfigError("--emit", "", fmt::format("the maximum's band reaches 0 (with every estimate at its high end and the calibrated reserve "
                                                  "nothing fits), so this plan may not run at any length: nothing written. Give --seqlen, "
                                                  "or --emit-length point to write the point estimate of {} tokens at 100% of usable memory",
                                                  integer_with_commas(seqlen)));
    if (shortest == 0)
      std::cerr << "longseq: WARNING: the maximum's band reaches 0: the point estimate written (" << integer_with_commas(seqlen)
                << " tokens, at 100% of usable memory) has no margin, and the plan may not run at any length\n";
    if (args.emit_length == "safe" && shortest < seqlen) {
      seqlen_basis = fmt::format("the band's low end (every estimate at its high end and the calibrated reserve); the point estimate {} "
                                 "has no margin", integer_with_commas(seqlen));
      seqlen = shortest;
    }
  }
  ExportRequest request;
  request.model = model;
  request.model_source = args.model;
  request.plan = plan;
  request.cluster = cluster;
  request.profile = profile;
  request.seqlen = seqlen;
  request.seqlen_basis = seqlen_basis;
  request.predicted_peak_bytes = memory_predict(model, cluster, plan, profile, seqlen, /*with_breakdown=*/false).gpu_peak_bytes;
  // Files name each other by absolute path, so a launch from any folder finds them (a bare name
  // resolves against the launching folder, not the file's).
  if (outputs.emit_companion)
    request.companion_file_name = std::filesystem::absolute(outputs.emit_companion->path).lexically_normal().string();
  else if (const CompanionFile companion = export_companion(args.emit); companion.placeholder)
    request.companion_file_name = companion.placeholder;
  if (outputs.emit_main && !outputs.emit_main->streams_to_terminal_or_pipe())
    request.main_file_name = std::filesystem::absolute(outputs.emit_main->path).lexically_normal().string();
  const ExportedConfig exported = config_emit(args.emit, request);
  for (const auto& note : exported.notes) std::cerr << "longseq: note: " << one_line_text(note) << "\n";
  if (!outputs.emit_main || outputs.emit_main->streams_to_terminal_or_pipe()) {
    // Standard output, a device or a FIFO: the files one after the other, the second headed by its name.
    std::string text;
    for (const auto& file : exported.files) {
      if (!file.suffix.empty()) text += "\n# ---- " + one_line_text(request.companion_file_name) + " (named by the file above) ----\n";
      text += file.text;
    }
    if (outputs.emit_main) output_file_write(*outputs.emit_main, text);
    else standard_output_write(text);
    return 0;
  }
  // Every file was checked before the work; each is written whole.
  for (const auto& file : exported.files) {
    const OutputFileTarget& target = file.suffix.empty() ? *outputs.emit_main : *outputs.emit_companion;
    output_file_write(target, file.text);
    std::cerr << "longseq: wrote " << target.path << " (" << plan_describe(plan) << ")\n";
  }
  return 0;
}

// --emit-out (and the DeepSpeed JSON beside it) and --plan-out, checked before any work: an
// existing file is refused without --overwrite, the model file read is never written over.
PlanOutputs plan_outputs_check(const PlanCommandArgs& args) {
  PlanOutputs outputs;
  const std::vector<std::string> inputs = {args.model};
  if (args.emit_out) {
    if (args.emit.empty()) throw ConfigError("--emit-out", "", "goes with --emit TARGET (the file the export is written to)");
    // The files name each other (and the model's folder) inside YAML, JSON, Python and TOML
    // strings, which hold UTF-8 text only: a path of other bytes could not be named there.
    for (const auto& [path, flag] : {std::pair{*args.emit_out, "--emit-out"}, std::pair{args.model, "--model"}})
      if (!utf8_valid(path))
        throw ConfigError(flag, "", fmt::format("the path '{}' is not UTF-8 text, and the exported files name it in strings that hold UTF-8 "
                                                "only: rename it", one_line_text(path)));
    outputs.emit_main = output_file_check(*args.emit_out, "--emit-out", args.overwrite, inputs);
    if (const CompanionFile companion = export_companion(args.emit); companion.suffix && !outputs.emit_main->streams_to_terminal_or_pipe()) {
      const std::filesystem::path main_file(*args.emit_out);
      const std::filesystem::path beside = main_file.parent_path() / (main_file.stem().string() + companion.suffix);
      outputs.emit_companion = output_file_check(beside.string(), fmt::format("--emit-out (the {} beside it)", companion.placeholder),
                                                 args.overwrite, inputs);
    }
  }
  if (args.plan_out) {
    // The plan file records the model's path for `run` to read back: in JSON, UTF-8 text only.
    if (!utf8_valid(args.model))
      throw ConfigError("--model", "", fmt::format("the path '{}' is not UTF-8 text, and the plan file (JSON) that records it holds UTF-8 "
                                                   "only: rename it", one_line_text(args.model)));
    outputs.plan_out = output_file_check(*args.plan_out, "--plan-out", args.overwrite, inputs);
  }
  return outputs;
}

// The sequence length a plan is for: the given one, or the longest that fits.
int64_t plan_seqlen(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan, const RuntimeProfile& profile,
                    std::optional<int64_t> seqlen, const ReportContext& context) {
  if (seqlen) return *seqlen;
  const int64_t grid = seqlen_grid(plan, context.length_multiple);
  const int64_t longest = max_seqlen_find(model, cluster, plan, profile, grid, /*with_breakdown=*/false).max_seqlen;
  if (context.max_step_s > 0 && longest > 0 && time_predict(model, cluster, plan, profile, longest).time.total_s() > context.max_step_s)
    return max_seqlen_within_step_time(model, cluster, plan, profile, grid, longest, context.max_step_s);
  return longest;
}

// A duration as --max-step-time takes it: a number of seconds, or with a unit (s, min, h, d).
double duration_parse(const std::string& text, const std::string& flag) {
  static const std::vector<std::pair<std::string, double>> units = {{"min", 60}, {"s", 1}, {"h", 3600}, {"d", 86400}};
  for (const auto& [unit, seconds] : units)
    if (text.size() > unit.size() && text.ends_with(unit))
      if (const std::optional<double> value = decimal_parse(text.substr(0, text.size() - unit.size())); value && *value > 0)
        return *value * seconds;
  if (const std::optional<double> value = decimal_parse(text); value && *value > 0) return *value;
  throw ConfigError(flag, "", fmt::format("expected a positive duration such as 3600, 90min, 1h or 2d, got '{}'", text));
}

// --plan-out: the plan with what it was made for, written whole.
void plan_out_write(const PlanCommandArgs& args, const OutputFileTarget& target, const ModelSpec& model, const ClusterSpec& cluster,
                    const RuntimeProfile& profile, const PlanOptions& plan, int64_t seqlen, bool machine) {
  if (seqlen <= 0) throw ConfigError("--plan-out", "", "no sequence length fits this plan, so there is nothing to run");
  PlanFile file;
  file.model = args.model;
  file.model_name = model.name;
  file.layers = args.layers;
  file.parameters = parameter_count(model).total;
  file.seqlen = seqlen;
  file.ranks = cluster.gpus;
  file.device = machine ? args.device : "cuda";
  // The budget the executor's arena gets: the device's memory less what its runtime holds beside it.
  file.device_budget_bytes = machine && args.budget_mib ? *args.budget_mib * 1024 * 1024
                                                        : cluster.hardware.gpu_memory_gib * kBytesPerGib - runtime_overhead_bytes(profile, cluster.gpus, plan.sequence_ranks());
  file.hardware = cluster.hardware.name;
  file.profile = profile.name;
  file.plan = plan;
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, seqlen, /*with_breakdown=*/false);
  file.predicted_peak_bytes = prediction.gpu_peak_bytes;
  file.predicted_host_bytes = prediction.host_bytes_per_node;
  output_file_write(target, plan_file_to_json(file));
  std::cerr << fmt::format("longseq: wrote {} ({} at {} tokens on {} rank(s); run it with: {}longseq run --plan {})\n", target.path,
                           plan_describe(plan), integer_with_commas(seqlen), cluster.gpus,
                           cluster.gpus > 1 ? fmt::format("mpirun -np {} ", cluster.gpus) : "", shell_quote(target.path));
}

}  // namespace longseq
