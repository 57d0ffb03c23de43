// plan_command.hpp: `longseq plan` — memory prediction and maximum sequence length for a plan.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

namespace longseq {

struct PlanCommandArgs;

// Registers the subcommand on `app`; the returned arguments are filled by CLI11's parse and must
// outlive it. plan_command_run returns the process exit code.
std::shared_ptr<PlanCommandArgs> plan_command_register(CLI::App& app);
int plan_command_run(const PlanCommandArgs& args);

}  // namespace longseq
