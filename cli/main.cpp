// main.cpp: the `longseq` command line. Subcommands: plan, sweep, report, run, validate, bench, models, hardware.
//
// Exit codes: 0 success (a plan that does not fit is an answer, not an error); 2 bad input or an
// impossible plan, with a one-line reason naming the file/flag and key; CLI11's own codes for
// malformed command lines; 70 for an internal error (a bug), never an abort; 74 when standard
// output cannot be written (a full disk, a closed stream): an answer nobody received is not success.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>
#include <map>
#include <algorithm>
#include <system_error>
#include <optional>
#include <string>
#include <tuple>

#include "cli/commands.hpp"
#include "io/checked_input.hpp"
#include "io/config_error.hpp"
#include "io/nearest_names.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "reports/memory_report.hpp"

namespace {

// `longseq models --json`: every card as --model takes it, with the dimensions the table prints
// (numbers as numbers), for scripts.
int models_json() {
  nlohmann::json cards = nlohmann::json::array();
  for (const auto& name : longseq::builtin_model_names()) {
    const longseq::ModelSpec model = longseq::model_load(name);
    const longseq::ParameterCount count = longseq::parameter_count(model);
    nlohmann::json card = {{"card", name},
                           {"name", model.name},
                           {"family", model.family},
                           {"parameters", count.total},
                           {"active_parameters", count.active},
                           {"layers", model.num_layers},
                           {"hidden_size", model.hidden_size},
                           {"q_heads", model.num_q_heads},
                           {"kv_heads", model.num_kv_heads},
                           {"head_dim", model.head_dim},
                           {"intermediate_size", model.intermediate_size},
                           {"vocab_size", model.vocab_size},
                           {"mlp", longseq::mlp_kind_name(model.mlp_kind)},
                           {"tied_embeddings", model.tied_embeddings},
                           // null where the card does not say (no config.json source for it yet)
                           {"max_position_embeddings", model.max_position_embeddings > 0 ? nlohmann::json(model.max_position_embeddings)
                                                                                         : nlohmann::json(nullptr)}};
    card["moe"] = nullptr;  // the same keys on every card (docs/json/models.schema.json)
    if (model.is_moe())
      card["moe"] = {{"experts", model.experts}, {"experts_per_token", model.experts_per_token},
                     {"expert_intermediate_size", model.expert_intermediate_size},
                     {"shared_expert_intermediate_size", model.shared_expert_intermediate_size},
                     {"dense_layers", model.dense_layers}, {"router", model.moe_router_sigmoid ? "sigmoid" : "softmax"}};
    card["latent_attention"] = nullptr;
    if (model.is_latent_attention())
      card["latent_attention"] = {{"q_lora_rank", model.latent_attention.q_lora_rank}, {"kv_lora_rank", model.latent_attention.kv_lora_rank},
                                  {"qk_rope_head_dim", model.latent_attention.qk_rope_head_dim},
                                  {"v_head_dim", model.latent_attention.v_head_dim}};
    cards.push_back(std::move(card));
  }
  fmt::print("{}\n", nlohmann::json{{"schema_version", 1}, {"command", "models"}, {"models", cards}}.dump(2));
  return 0;
}

// `longseq hardware --json`: every card's datasheet figures as the table prints them.
int hardware_json() {
  nlohmann::json cards = nlohmann::json::array();
  for (const auto& name : longseq::builtin_hardware_names()) {
    const longseq::HardwareCard card = longseq::hardware_card_load(name);
    cards.push_back({{"card", name},
                     {"gpu_memory_gib", card.gpu_memory_gib},
                     {"peak_bf16_tflops", card.peak_bf16_tflops},
                     {"gpus_per_node", card.gpus_per_node},
                     {"host_memory_gib", card.host_memory_gib},
                     {"pcie_host_to_device_gbps", card.pcie_host_to_device_gbps},
                     {"nvlink_gbps", card.nvlink_gbps},
                     {"internode_gbps_per_node", card.internode_gbps_per_node},
                     {"rates", card.approximate_rates.empty() ? "sourced" : "scaled"}});
  }
  fmt::print("{}\n", nlohmann::json{{"schema_version", 1}, {"command", "hardware"}, {"hardware", cards}}.dump(2));
  return 0;
}

// The built-in cards by family, each with its exact parameter count (total, and what one token uses:
// all of a dense model, its routed experts' share of a mixture of experts) and its shape.
int models_list() {
  std::map<std::string, std::vector<longseq::ModelSpec>> families;
  for (const auto& name : longseq::builtin_model_names()) {
    longseq::ModelSpec model = longseq::model_load(name);
    model.name = name;  // the card's name as --model takes it
    families[model.family].push_back(std::move(model));
  }
  size_t cards = 0;
  for (auto& [family, models] : families) {
    std::sort(models.begin(), models.end(), [](const auto& a, const auto& b) {
      return longseq::parameter_count(a).total < longseq::parameter_count(b).total;
    });
    fmt::print("{}\n", family);
    for (const auto& model : models) {
      const int64_t total = longseq::parameter_count(model).total;
      const int64_t active = longseq::parameter_count(model).active;
      fmt::print("  {:<18} {:>17} total {:>17} active  L={} h={} q/kv heads={}/{} d={} f={} V={} {}{}{}\n", model.name,
                 longseq::integer_with_commas(total), longseq::integer_with_commas(active), model.num_layers, model.hidden_size,
                 model.num_q_heads, model.num_kv_heads, model.head_dim, model.intermediate_size, model.vocab_size,
                 longseq::mlp_kind_name(model.mlp_kind), model.tied_embeddings ? " tied" : "",
                 model.is_moe() ? fmt::format(" MoE {} experts x {} ({} a token{})", model.experts, model.expert_intermediate_size,
                                              model.experts_per_token,
                                              model.shared_expert_intermediate_size > 0
                                                  ? fmt::format(", shared {}", model.shared_expert_intermediate_size)
                                                  : "")
                                : "");
      ++cards;
    }
  }
  fmt::print("{} cards; --model also takes published names (meta-llama/Llama-3.1-8B-Instruct, gemma-2-9b-it), a card file "
             "(models/cards/README.md) or a config.json\n", cards);
  return 0;
}

int hardware_list() {
  // The rates of a card marked `~` are scaled from another card's measurements (its approximate_rates).
  fmt::print("{:<18} {:>8} {:>8} {:>6} {:>9} {:>9} {:>8} {:>10}  {}\n", "card", "GPU GiB", "TFLOPS", "GPUs", "host GiB",
             "PCIe GB/s", "NVL GB/s", "net GB/s", "rates");
  for (const auto& name : longseq::builtin_hardware_names()) {
    const longseq::HardwareCard card = longseq::hardware_card_load(name);
    fmt::print("{:<18} {:>8.2f} {:>8.0f} {:>6} {:>9.0f} {:>9.2f} {:>8.0f} {:>10.0f}  {}\n", name, card.gpu_memory_gib,
               card.peak_bf16_tflops, card.gpus_per_node, card.host_memory_gib, card.pcie_host_to_device_gbps,
               card.nvlink_gbps, card.internode_gbps_per_node, card.approximate_rates.empty() ? "sourced" : "~ scaled");
  }
  fmt::print("\n~ scaled: no matmul or attention measurement of the card; its rates are another card's measured shares of peak "
             "applied to its datasheet peak, and every plan on it says so\n");
  return 0;
}

// Every numeric flag reads a plain decimal: CLI11 alone would take 0x10 as 16, nan and inf as
// numbers, and saturate 99999999999999999999 to INT64_MAX ("9223372036854775807 GPUs").
void numeric_flags_check(CLI::App& app) {
  for (CLI::App* command : app.get_subcommands({})) {
    for (CLI::Option* option : command->get_options({})) {
      // "INT", or "INT:INT in [1 - 100000]" once a range check describes it.
      const std::string type = option->get_type_name().substr(0, option->get_type_name().find(':'));
      const bool integer = type == "INT" || type == "UINT", number = integer || type == "FLOAT";
      if (!number || option->get_type_size() == 0) continue;
      option->transform(CLI::Validator(
          [integer](std::string& text) -> std::string {
            if (!longseq::decimal_parse(text)) return fmt::format("expected a plain decimal number, got '{}'", text);
            if (!integer) return "";
            const std::optional<int64_t> whole = longseq::integer_parse(text);
            if (!whole) return fmt::format("expected a whole number, got '{}'", text);
            text = std::to_string(*whole);  // 1e3 as 1000 for CLI11's integer conversion
            return "";
          },
          ""));  // no name: the help keeps CLI11's own "INT in [1 - 100000]"
    }
  }
}

// Whether everything printed reached standard output: flushed now, so a full disk or a closed
// stream is found before the exit status says success.
bool standard_output_flushed() {
  std::cout.flush();
  return std::cout.good() && std::fflush(stdout) == 0 && !std::ferror(stdout);
}

// Why the command line names something unknown (nullopt: nothing): the first word that is not a
// subcommand, or a long option the subcommand does not have (before any "--"), with the nearest
// known names.
std::optional<std::string> unknown_word_message(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return std::nullopt;
  const std::string word = argv[1];
  std::vector<std::string> commands;
  CLI::App* command = nullptr;
  for (CLI::App* candidate : app.get_subcommands({})) {
    commands.push_back(candidate->get_name());
    if (candidate->check_name(word)) command = candidate;
  }
  if (!command) {
    const std::vector<std::string> nearest = longseq::nearest_names(word, commands, 2, std::max<size_t>(1, word.size() / 3));
    std::string listed;
    for (const std::string& name : commands) listed += (listed.empty() ? "" : ", ") + name;
    return fmt::format("unknown command '{}'{} (commands: {})", word, nearest.empty() ? "" : "; did you mean " + longseq::names_listed(nearest) + "?",
                       listed);
  }
  std::vector<std::string> options;
  for (const CLI::Option* option : command->get_options({}))
    for (const std::string& name : option->get_lnames()) options.push_back("--" + name);
  for (int i = 2; i < argc; ++i) {
    const std::string token = argv[i];
    if (token == "--") break;
    if (token.size() < 3 || token.rfind("--", 0) != 0) continue;
    const std::string name = token.substr(0, token.find('='));
    if (std::find(options.begin(), options.end(), name) != options.end()) continue;
    const std::vector<std::string> nearest = longseq::nearest_names(name, options, 2, std::max<size_t>(2, name.size() / 3));
    return fmt::format("{}: not an option of longseq {}{} (longseq {} --help lists them)", name, word,
                       nearest.empty() ? "" : "; did you mean " + longseq::names_listed(nearest) + "?", word);
  }
  return std::nullopt;
}

int command_run(CLI::App& app, CLI::App* models, CLI::App* hardware, const auto& arguments) {
  const auto& [plan_args, validate_args, bench_args, sweep_args, report_args, run_args, launch_args] = arguments;
  if (app.got_subcommand("plan")) return longseq::plan_command_run(*plan_args);
  if (app.got_subcommand("validate")) return longseq::validate_command_run(*validate_args);
  if (app.got_subcommand("bench")) return longseq::bench_command_run(*bench_args);
  if (app.got_subcommand("sweep")) return longseq::sweep_command_run(*sweep_args);
  if (app.got_subcommand("report")) return longseq::report_command_run(*report_args);
  if (app.got_subcommand("run")) return longseq::run_command_run(*run_args);
  if (app.got_subcommand("launch")) return longseq::launch_command_run(*launch_args);
  if (models->parsed()) return models->count("--json") > 0 ? models_json() : models_list();
  if (hardware->parsed()) return hardware->count("--json") > 0 ? hardware_json() : hardware_list();
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
  for (CLI::App* listing : {models, hardware}) listing->add_flag("--json")->description("the cards as JSON (numbers as numbers), for scripts");
  numeric_flags_check(app);
  // Options belong to a subcommand: one before it (`longseq --bogus plan`) would otherwise be
  // reported as whatever the subcommand misses first.
  for (int i = 1; i < argc && argv[i][0] == '-'; ++i) {
    const std::string word = argv[i];
    if (word == "-h" || word == "--help" || word == "--help-all" || word == "--version") break;
    std::cerr << "longseq: error: "
              << longseq::ConfigError(word, "", "not an option of longseq itself; options go after the subcommand (longseq plan --help)").what()
              << "\n";
    return 2;
  }
  // A subcommand or a long option that names nothing, said as such with the nearest names: CLI11
  // would report it as whatever is missing first ("A subcommand is required", "--model is required").
  if (const std::optional<std::string> unknown = unknown_word_message(app, argc, argv)) {
    std::cerr << "longseq: error: " << *unknown << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    // A malformed command line is bad input like any other: one line naming the flag, exit 2.
    std::cerr << "longseq: error: " << error.what() << " (see --help)\n";
    return 2;
  }
  int status = 0;
  try {
    status = command_run(app, models, hardware,
                         std::tie(plan_args, validate_args, bench_args, sweep_args, report_args, run_args, launch_args));
  } catch (const longseq::ConfigError& error) {
    std::cerr << "longseq: error: " << error.what() << "\n";
    return 2;
  } catch (const std::system_error& error) {
    // fmt::print throws when standard output refuses a write (a full disk): not a bug, an output
    // nobody received.
    if (std::ferror(stdout)) {
      std::cerr << "longseq: error: cannot write standard output: " << error.code().message() << "\n";
      return 74;
    }
    std::cerr << "longseq: internal error (a bug in longseq; please report it with the command): " << error.what() << "\n";
    return 70;
  } catch (const std::exception& error) {
    // Bad input is a ConfigError by the readers' contract (io/checked_input.hpp); anything
    // else is a bug, reported as one (exit 70, EX_SOFTWARE) rather than aborting the program.
    std::cerr << "longseq: internal error (a bug in longseq; please report it with the command): " << error.what() << "\n";
    return 70;
  }
  if (!standard_output_flushed()) {
    std::cerr << "longseq: error: cannot write standard output" << (errno ? fmt::format(": {}", std::strerror(errno)) : "") << "\n";
    return 74;  // EX_IOERR
  }
  return status;
}
