// report.hpp: `longseq report DIR` — figures (PNG and SVG, drawn by gnuplot) and report.md from a
// sweep's results.json. Figures are built in a staging directory and moved into place only when
// gnuplot has drawn all of them.
#pragma once

#include <string>
#include <vector>

namespace longseq {

struct ReportOutcome {
  std::vector<std::string> figures;  // PNG paths written
  std::string report_path;           // report.md
};

// Reads and checks a run result (run.json) or a sweep result (results.json) whole, as the report
// does before it writes anything; throws ConfigError naming the file and key of the first value
// that is missing or of the wrong kind. (Exposed for the fuzz harnesses, tests/fuzz.)
void run_result_check(const std::string& json_text, const std::string& source);
void sweep_result_check(const std::string& json_text, const std::string& source);

// Throws ConfigError when DIR has no readable results.json or gnuplot fails, or (without
// `overwrite`) when DIR holds a report.md or figures/ that longseq's manifest there does not list.
ReportOutcome report_write(const std::string& results_dir, const std::string& gnuplot_command = "gnuplot", bool overwrite = false);

}  // namespace longseq
