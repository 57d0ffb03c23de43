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

// Throws ConfigError when DIR has no readable results.json or gnuplot fails.
ReportOutcome report_write(const std::string& results_dir, const std::string& gnuplot_command = "gnuplot");

}  // namespace longseq
