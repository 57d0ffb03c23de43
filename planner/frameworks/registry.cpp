// registry.cpp: every framework longseq plans for, each described in its own file beside this one;
// adding a framework is its file and its line here (and its --emit writer, reports/exporters/).
#include "planner/frameworks.hpp"

namespace longseq {

extern const FrameworkDescription kArcticTraining, kHfAccelerate, kMegatronDeepSpeed, kDeepSpeed, kUsp, kAccelerateFsdp2, kHfTrainer,
    kTorchtitan, kUnsloth, kLongseq, kMegatronCore;

const std::vector<const FrameworkDescription*>& framework_descriptions() {
  static const std::vector<const FrameworkDescription*> all = {&kArcticTraining, &kHfAccelerate, &kMegatronDeepSpeed, &kDeepSpeed,
                                                               &kUsp,            &kAccelerateFsdp2, &kHfTrainer,     &kTorchtitan,
                                                               &kUnsloth,        &kLongseq,       &kMegatronCore};
  return all;
}

}  // namespace longseq
