// validate_command.hpp: `longseq validate --points FILE.csv` — predicted vs published.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

namespace longseq {

struct ValidateCommandArgs;
std::shared_ptr<ValidateCommandArgs> validate_command_register(CLI::App& app);
int validate_command_run(const ValidateCommandArgs& args);

}  // namespace longseq
