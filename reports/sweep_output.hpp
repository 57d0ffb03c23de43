// sweep_output.hpp: a sweep's results on disk — results.csv, results.json and results.md in one
// directory, written to a temporary directory first and moved into place only when complete, so
// a failed sweep never leaves half a result behind.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/scenario.hpp"

namespace longseq {

// The CSV/JSON columns, in order. Every row has every column (empty when not applicable).
const std::vector<std::string>& sweep_columns();

nlohmann::json sweep_results_to_json(const Scenario& scenario, const std::vector<SweepRow>& rows);

// Writes the three files into `out_dir` (created; an existing directory is replaced only after
// the new one is complete). Throws ConfigError when the directory cannot be written.
void sweep_results_write(const Scenario& scenario, const std::vector<SweepRow>& rows, const std::string& out_dir);

// The markdown table of the results (also results.md's body).
std::string sweep_markdown_table(const nlohmann::json& results);

}  // namespace longseq
