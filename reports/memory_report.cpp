#include "reports/memory_report.hpp"

#include <cmath>

#include <fmt/format.h>

#include "models/layer_inventory.hpp"
#include "planner/units.hpp"

namespace longseq {

std::string integer_with_commas(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

namespace {

constexpr const char* kGpuCategoryOrder[] = {kCategoryModelStates, kCategoryZero,     kCategoryCheckpoints,
                                             kCategoryLayer,       kCategoryLoss,     kCategoryInputs,
                                             kCategoryRuntime,     kCategoryCalibrated};

void items_render(std::string& out, const std::vector<MemoryItem>& items, const std::string& category, bool mib = false) {
  for (const auto& item : items) {
    if (item.category != category) continue;
    const std::string count = item.count != 1 ? fmt::format("x{:g}", item.count) : "";
    out += fmt::format("    {:<38} {:>6} {:>10.2f}\n", item.name, count, mib ? item.bytes / (1024.0 * 1024.0) : bytes_to_gib(item.bytes));
  }
}

double category_bytes(const std::vector<MemoryItem>& items, const std::string& category) {
  double bytes = 0;
  for (const auto& item : items)
    if (item.category == category) bytes += item.bytes;
  return bytes;
}

}  // namespace

std::string memory_table_render(const MemoryPrediction& prediction, int64_t ranks_per_node) {
  // A device of a few GiB or less (this machine's executor with a budget in MiB) is shown in MiB,
  // where its lines are not all 0.00.
  const bool mib = prediction.gpu_capacity_bytes < 4.0 * kBytesPerGib;
  const char* unit = mib ? "MiB" : "GiB";
  auto in_unit = [&](double bytes) { return mib ? bytes / (1024.0 * 1024.0) : bytes_to_gib(bytes); };
  std::string out;
  out += fmt::format("GPU memory per rank at the peak ({}, during {})\n", prediction.gpu_peak_phase, prediction.gpu_peak_moment);
  out += fmt::format("  {:<40} {:>6} {:>10}\n", "component", "count", unit);
  for (const char* category : kGpuCategoryOrder) {
    const double bytes = category_bytes(prediction.gpu_items, category);
    if (bytes <= 0) continue;
    out += fmt::format("  {:<47} {:>10.2f}\n", category, in_unit(bytes));
    items_render(out, prediction.gpu_items, category, mib);
  }
  out += fmt::format("  {:<47} {:>10.2f} of {:.2f} {} ({:.1f}%){}\n", "total", in_unit(prediction.gpu_peak_bytes),
                     in_unit(prediction.gpu_capacity_bytes), unit, 100.0 * prediction.gpu_peak_bytes / prediction.gpu_capacity_bytes,
                     prediction.fits_gpu() ? "" : "  DOES NOT FIT");
  if (prediction.gpu_headroom_bytes > 0)
    out += fmt::format("  (usable: the card's {:.2f} {} less {:.2f} {} of headroom the runtime profile keeps free)\n",
                       in_unit(prediction.gpu_capacity_bytes + prediction.gpu_headroom_bytes), unit,
                       in_unit(prediction.gpu_headroom_bytes), unit);
  out += "  phase peaks:";
  for (const auto& phase : prediction.phases) out += fmt::format(" {} {:.2f} {};", phase.phase, in_unit(phase.bytes), unit);
  out.back() = '\n';

  out += fmt::format("\nHost memory per node ({} rank{})\n", ranks_per_node, ranks_per_node == 1 ? "" : "s");
  if (prediction.host_items.empty()) out += "  (nothing offloaded)\n";
  items_render(out, prediction.host_items, kCategoryHost, mib);
  out += fmt::format("  {:<47} {:>10.2f} of {:.2f} {} ({:.1f}%){}\n", "total", in_unit(prediction.host_bytes_per_node),
                     in_unit(prediction.host_capacity_bytes), unit, 100.0 * prediction.host_bytes_per_node / prediction.host_capacity_bytes,
                     prediction.fits_host() ? "" : "  DOES NOT FIT");
  return out;
}

nlohmann::json memory_prediction_to_json(const MemoryPrediction& prediction) {
  auto items_json = [](const std::vector<MemoryItem>& items) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& item : items)
      array.push_back({{"category", item.category}, {"name", item.name}, {"count", item.count},
                       {"bytes", item.bytes}, {"gib", bytes_to_gib(item.bytes)}});
    return array;
  };
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& phase : prediction.phases)
    phases.push_back({{"phase", phase.phase}, {"moment", phase.moment}, {"gib", bytes_to_gib(phase.bytes)}});
  return {
      {"kind", "prediction"},
      {"seqlen", prediction.seqlen},
      {"local_tokens", prediction.local_tokens},
      {"mlp_tiles", prediction.mlp_tiles},
      {"loss_tile_tokens", prediction.loss_tile_tokens},
      {"kv_replication", prediction.kv_replication},
      {"fits", prediction.fits()},
      {"gpu",
       {{"fits", prediction.fits_gpu()},
        {"peak_gib", bytes_to_gib(prediction.gpu_peak_bytes)},
        {"capacity_gib", bytes_to_gib(prediction.gpu_capacity_bytes)},
        {"headroom_gib", bytes_to_gib(prediction.gpu_headroom_bytes)},
        {"calibrated_reserve_gib", bytes_to_gib(prediction.gpu_calibrated_bytes)},
        {"peak_phase", prediction.gpu_peak_phase},
        {"peak_moment", prediction.gpu_peak_moment},
        {"phases", phases},
        {"items", items_json(prediction.gpu_items)}}},
      {"host_per_node",
       {{"fits", prediction.fits_host()},
        {"total_gib", bytes_to_gib(prediction.host_bytes_per_node)},
        {"capacity_gib", bytes_to_gib(prediction.host_capacity_bytes)},
        {"items", items_json(prediction.host_items)}}},
  };
}

}  // namespace longseq

namespace longseq {

std::string duration_text(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "-";
  if (seconds < 60) return fmt::format("{:.1f} s", seconds);
  const auto whole = static_cast<int64_t>(std::llround(seconds));
  if (whole < 3600) return fmt::format("{} min {} s", whole / 60, whole % 60);
  if (whole < 86400) return fmt::format("{} h {} min", whole / 3600, whole % 3600 / 60);
  return fmt::format("{} d {} h", whole / 86400, whole % 86400 / 3600);
}

namespace {

double tokens_per_day(const TimePrediction& prediction) { return prediction.tokens_per_s * 86400.0; }

double cost_per_billion_tokens(const TimePrediction& prediction, const TimeContext& context) {
  return longseq::cost_per_billion_tokens(prediction.tokens_per_s, context.gpus, context.gpu_hour_cost);
}

}  // namespace

std::string time_table_render(const TimePrediction& prediction, const TimeContext& context) {
  const StepTime& time = prediction.time;
  std::string out = fmt::format("Step time per rank: {:.2f} s ({})\n", time.total_s(), duration_text(time.total_s()));
  if (prediction.accumulation_steps > 1)
    out += fmt::format("  one optimizer step: {} micro-steps of gradient accumulation (their compute and traffic, summed) and the "
                       "optimizer once\n", prediction.accumulation_steps);
  auto line = [&](const std::string& name, double seconds) {
    if (seconds > 0) out += fmt::format("    {:<48} {:>10.3f} s\n", name, seconds);
  };
  // With FP8 GEMMs among them their rate is an approximation (fp8_rate_caveat), and the label says so.
  line(prediction.executed_flops.matmul_fp8 > 0 ? "matmul (bf16 at measured MAMF, FP8 approx.)" : "matmul (GEMMs at measured MAMF)", time.matmul_s);
  line(fmt::format("attention ({} fwd+bwd rate)", attention_kernel_facts(prediction.attention_kernel).label), time.attention_s);
  line("ulysses all-to-all (exposed)", time.ulysses_all_to_all_s);
  line("zero communication (exposed)", time.zero_communication_exposed_s);
  line("checkpoint offload (exposed)", time.checkpoint_offload_s);
  line("fpdt chunk fetches (exposed)", time.fpdt_fetch_exposed_s);
  line("ring attention passing (exposed)", time.ring_exposed_s);
  line("ring dk/dv final hop", time.ring_final_hop_s);
  line("tensor parallel gathers/scatters (exposed)", time.tensor_parallel_exposed_s);
  line("expert-parallel all-to-all (dispatch, combine)", time.expert_all_to_all_s);
  line("activation offload to the host (exposed)", time.activation_offload_s);
  line("pipeline bubble (1F1B idle: (pp - 1) / vpp slots)", time.pipeline_bubble_s);
  line("pipeline sends between stages", time.pipeline_p2p_s);
  line("gradients to the host (in backward)", time.gradient_offload_s);
  line("optimizer step", time.optimizer_s);
  line("element-wise (norms, RoPE, SwiGLU, loss softmax)", time.elementwise_s);
  // A CPU "device" runs at GFLOP/s: in TFLOPS every figure would read 0.0 beside a real MFU.
  const bool giga = prediction.hardware_tflops_per_gpu < 1.0;
  out += fmt::format("  {}: {:.1f} hardware (the FLOPs executed, causal attention, recompute included), {:.1f} by the "
                     "ALST/Megatron formula (it counts attention as non-causal, twice the causal work, so it can exceed the card's "
                     "peak)\n",
                     giga ? "GFLOPS per rank" : "TFLOPS per GPU", prediction.hardware_tflops_per_gpu * (giga ? 1000 : 1),
                     prediction.megatron_tflops_per_gpu * (giga ? 1000 : 1));
  out += fmt::format("  MFU {:.1f}% (model FLOPs of forward and backward, causal, without recompute, per second, over the device's dense "
                     "{}peak)\n", 100.0 * prediction.mfu, giga ? "" : "bf16 ");
  out += fmt::format("  throughput: {:.0f} tokens/s for the cluster, {} tokens a day", prediction.tokens_per_s,
                     seqlen_format(static_cast<int64_t>(std::llround(tokens_per_day(prediction)))));
  if (const double cost = cost_per_billion_tokens(prediction, context); cost > 0)
    out += fmt::format("; at {:.2f} per GPU-hour, {:.0f} per billion tokens ({} GPUs)", context.gpu_hour_cost, cost, context.gpus);
  out += "\n";
  if (time.total_s() > kStepTooLongS)
    out += fmt::format("  WARNING: one optimizer step takes {}: no run trains like this; --max-step-time finds the longest length "
                       "whose step fits a limit\n", duration_text(time.total_s()));
  else if (time.total_s() > 3600)
    out += fmt::format("  note: one optimizer step takes {}; 1,000 steps take {}\n", duration_text(time.total_s()),
                       duration_text(1000 * time.total_s()));
  return out;
}

nlohmann::json time_prediction_to_json(const TimePrediction& prediction, const TimeContext& context) {
  const StepTime& time = prediction.time;
  return {
      {"kind", "prediction"},
      {"step_s", time.total_s()},
      {"accumulation_steps", prediction.accumulation_steps},
      {"step_text", duration_text(time.total_s())},
      {"step_too_long", time.total_s() > kStepTooLongS},
      {"tokens_per_day", tokens_per_day(prediction)},
      {"gpu_hour_cost", context.gpu_hour_cost > 0 ? nlohmann::json(context.gpu_hour_cost) : nlohmann::json(nullptr)},
      {"cost_per_billion_tokens", context.gpu_hour_cost > 0 ? nlohmann::json(cost_per_billion_tokens(prediction, context)) : nlohmann::json(nullptr)},
      {"attention_kernel", prediction.attention_kernel},
      {"components_s",
       {{"matmul", time.matmul_s},
        {"attention", time.attention_s},
        {"ulysses_all_to_all", time.ulysses_all_to_all_s},
        {"zero_communication_exposed", time.zero_communication_exposed_s},
        {"checkpoint_offload", time.checkpoint_offload_s},
        {"fpdt_fetch_exposed", time.fpdt_fetch_exposed_s},
        {"ring_exposed", time.ring_exposed_s},
        {"ring_final_hop", time.ring_final_hop_s},
        {"tensor_parallel_exposed", time.tensor_parallel_exposed_s},
        {"expert_all_to_all", time.expert_all_to_all_s},
        {"activation_offload", time.activation_offload_s},
        {"pipeline_bubble", time.pipeline_bubble_s},
        {"pipeline_p2p", time.pipeline_p2p_s},
        {"gradient_offload", time.gradient_offload_s},
        {"optimizer", time.optimizer_s},
        {"elementwise", time.elementwise_s}}},
      {"executed_flops", prediction.executed_flops.total()},
      {"hardware_tflops_per_gpu", prediction.hardware_tflops_per_gpu},
      {"megatron_tflops_per_gpu", prediction.megatron_tflops_per_gpu},
      {"mfu", prediction.mfu},
      {"tokens_per_s", prediction.tokens_per_s},
  };
}

}  // namespace longseq
