// sweep_output.hpp: a sweep's results on disk — results.csv, results.json and results.md in one
// directory, written whole into a staging directory first and moved in only when complete, so a
// failed sweep never leaves half a result behind; nothing else in the directory is touched.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/scenario.hpp"

namespace longseq {

// What a sweep and its report write into their directory (and so may replace on a rerun).
const std::vector<std::string>& sweep_output_names();

// The CSV/JSON columns, in order. Every row has every column (empty when not applicable).
const std::vector<std::string>& sweep_columns();

nlohmann::json sweep_results_to_json(const Scenario& scenario, const std::vector<SweepRow>& rows);

// Writes the three files into `out_dir` (created when missing). A directory holding anything but
// a sweep's own files is refused unless `overwrite`, and then only the three files are replaced. Throws ConfigError (naming
// `flag`) when the directory cannot be used or written.
void sweep_results_write(const Scenario& scenario, const std::vector<SweepRow>& rows, const std::string& out_dir,
                         bool overwrite = false, const std::string& flag = "--out");

// The markdown table of the results (also results.md's body). `source` names the file the
// results were read from, for errors in a hand-edited or foreign results.json.
std::string sweep_markdown_table(const nlohmann::json& results, const std::string& source = "results.json");

}  // namespace longseq
