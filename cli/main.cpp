// main.cpp: the `longseq` command line. Subcommands: plan, sweep, report, run, validate, bench, models, hardware.
//
// Exit codes: 0 success (a plan that does not fit is an answer, not an error); 2 bad input or an
// impossible plan, with a one-line reason naming the file/flag and key; CLI11's own codes for
// malformed command lines.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <iostream>

#include "cli/commands.hpp"
#include "models/config_error.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "reports/memory_report.hpp"

namespace {

int models_list() {
  fmt::print("{:<16} {:>16}  {}\n", "card", "parameters", "shape");
  for (const auto& name : longseq::builtin_model_names()) {
    const longseq::ModelSpec model = longseq::model_load(name);
    fmt::print("{:<16} {:>16}  L={} h={} q/kv heads={}/{} d={} f={} V={} {}{}\n", name,
               longseq::integer_with_commas(longseq::parameter_count(model).total), model.num_layers, model.hidden_size,
               model.num_q_heads, model.num_kv_heads, model.head_dim, model.intermediate_size, model.vocab_size,
               longseq::mlp_kind_name(model.mlp_kind), model.tied_embeddings ? " tied" : "");
  }
  return 0;
}

int hardware_list() {
  fmt::print("{:<16} {:>8} {:>8} {:>6} {:>9} {:>8} {:>8} {:>10}\n", "card", "GPU GiB", "TFLOPS", "GPUs", "host GiB",
             "PCIe GB/s", "NVL GB/s", "net GB/s");
  for (const auto& name : longseq::builtin_hardware_names()) {
    const longseq::HardwareCard card = longseq::hardware_card_load(name);
    fmt::print("{:<16} {:>8.2f} {:>8.0f} {:>6} {:>9.0f} {:>8.2f} {:>8.0f} {:>10.0f}\n", name, card.gpu_memory_gib,
               card.peak_bf16_tflops, card.gpus_per_node, card.host_memory_gib, card.pcie_host_to_device_gbps,
               card.nvlink_gbps, card.internode_gbps_per_node);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"longseq: plan, simulate and run long-sequence LLM training (ALST, FPDT)"};
  app.set_version_flag("--version", "longseq 0.1.0");
  app.require_subcommand(1);
  auto plan_args = longseq::plan_command_register(app);
  auto validate_args = longseq::validate_command_register(app);
  auto bench_args = longseq::bench_command_register(app);
  auto sweep_args = longseq::sweep_command_register(app);
  auto report_args = longseq::report_command_register(app);
  auto run_args = longseq::run_command_register(app);
  auto launch_args = longseq::launch_command_register(app);
  CLI::App* models = app.add_subcommand("models", "List the built-in model cards with exact parameter counts");
  CLI::App* hardware = app.add_subcommand("hardware", "List the built-in hardware cards");
  CLI11_PARSE(app, argc, argv);
  try {
    if (app.got_subcommand("plan")) return longseq::plan_command_run(*plan_args);
    if (app.got_subcommand("validate")) return longseq::validate_command_run(*validate_args);
    if (app.got_subcommand("bench")) return longseq::bench_command_run(*bench_args);
    if (app.got_subcommand("sweep")) return longseq::sweep_command_run(*sweep_args);
    if (app.got_subcommand("report")) return longseq::report_command_run(*report_args);
    if (app.got_subcommand("run")) return longseq::run_command_run(*run_args);
    if (app.got_subcommand("launch")) return longseq::launch_command_run(*launch_args);
    if (models->parsed()) return models_list();
    if (hardware->parsed()) return hardware_list();
  } catch (const longseq::ConfigError& error) {
    std::cerr << "longseq: error: " << error.what() << "\n";
    return 2;
  }
  return 0;
}
