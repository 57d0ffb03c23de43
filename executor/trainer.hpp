// trainer.hpp: training steps on one rank with measurement — data, steps, and the measured
// memory breakdown to set beside the planner's prediction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/llama.hpp"
#include "planner/plan.hpp"

namespace longseq {

// One training sample: tokens, pre-shifted labels (-100 = ignored), position ids.
struct Sample {
  std::vector<int32_t> tokens, labels, positions;
};

// A synthetic long-range task: a random key span appears early and must be copied at the end,
// after filler that follows a fixed cycle (easy to learn, so the loss visibly falls while the
// copy needs attention across the whole sequence). Deterministic for a seed.
Sample sample_synthetic(int64_t seqlen, int64_t vocab, uint32_t seed);

// Byte-level sample from a text file (the bytes are the tokens; vocab must be >= 256), starting
// at `offset` and wrapping around. Throws ConfigError when the file cannot be read or is empty.
Sample sample_from_text(const std::string& text, int64_t seqlen, int64_t offset);

// The planner's view of an executor run: Ulysses over `sp` ranks, ZeRO stage 0 (replicated) or 3
// (LlamaModel built sharded over every rank, optionally with the optimizer offloaded to the host),
// with the executor's options.
PlanOptions executor_plan(const TrainingOptions& options, int64_t sp = 1, int zero_stage = 0, bool offload_optimizer = false);

// This machine's CPU "device" as a cluster of `ranks` one-GPU ranks on one node, each with
// `budget_bytes` (infinite: unbounded).
ClusterSpec executor_cluster(double budget_bytes, int64_t ranks = 1);

struct StepMeasurement {
  int64_t step = 0;
  double loss = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double device_peak_bytes = 0;  // the arena's peak so far
  double host_peak_bytes = 0;
};

}  // namespace longseq
