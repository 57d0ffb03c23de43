// export.hpp: a plan as the configuration of the framework that will run it — a DeepSpeed JSON
// config, or an Accelerate config YAML with the parallelism_config keys of the HF Ulysses
// integration (../shared/seeds/003). What the target cannot express is returned as notes (the
// CLI prints them on stderr; the YAML also carries them as comments).
#pragma once

#include <string>
#include <vector>

#include "planner/plan.hpp"

namespace longseq {

struct ExportedConfig {
  std::string text;                // the file's content
  std::vector<std::string> notes;  // settings with no equivalent in the target, and where to set them
};

ExportedConfig deepspeed_config_emit(const PlanOptions& plan, const ClusterSpec& cluster, const RuntimeProfile& profile);
ExportedConfig accelerate_config_emit(const PlanOptions& plan, const ClusterSpec& cluster, const RuntimeProfile& profile);

}  // namespace longseq
