// clusters.hpp: the clusters the planner's tests plan on, built as `plan --gpu CARD --gpus N` builds
// them (the card's nodes and host memory).
#pragma once

#include <cstdint>
#include <string>

#include "planner/cards.hpp"
#include "planner/plan.hpp"

namespace longseq::testing {

inline ClusterSpec card_cluster(const std::string& card, int64_t gpus) { return cluster_make(hardware_card_load(card), gpus, 0, 0, 0); }
inline ClusterSpec h100s(int64_t gpus) { return card_cluster("h100-sxm-80gb", gpus); }

}  // namespace longseq::testing
