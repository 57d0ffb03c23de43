#include "executor/trainer.hpp"

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "models/config_error.hpp"

namespace longseq {

Sample sample_synthetic(int64_t seqlen, int64_t vocab, uint32_t seed) {
  if (vocab < 2 || vocab > kModelDimensionLimit)
    throw ConfigError("--model", "vocab_size", fmt::format("the synthetic task needs 2 to {} tokens, got {}", kModelDimensionLimit, vocab));
  Sample sample;
  std::mt19937 generator(seed);
  const int64_t key_length = std::max<int64_t>(1, std::min<int64_t>(32, seqlen / 8));
  const int32_t marker = static_cast<int32_t>(vocab - 1);
  // Filler cycles through tokens [0, 16) and keys come from [16, V-1); a vocabulary too small for
  // both shares [0, V-1) between them (the marker V-1 stays unique).
  const int32_t filler_tokens = static_cast<int32_t>(std::min<int64_t>(16, vocab - 1));
  const int32_t first_key_token = vocab - 2 >= 16 ? 16 : 0;
  std::uniform_int_distribution<int32_t> key_token(first_key_token, static_cast<int32_t>(vocab) - 2);
  std::vector<int32_t> key(static_cast<size_t>(key_length));
  for (auto& token : key) token = key_token(generator);
  // [key] [filler cycle 0..15 ...] [marker] [key again]
  for (int64_t i = 0; i < seqlen; ++i) {
    const int64_t tail = seqlen - key_length;
    int32_t token;
    if (i < key_length) token = key[static_cast<size_t>(i)];
    else if (i < tail - 1) token = static_cast<int32_t>(i % filler_tokens);
    else if (i == tail - 1) token = marker;
    else token = key[static_cast<size_t>(i - tail)];
    sample.tokens.push_back(token);
    sample.positions.push_back(static_cast<int32_t>(i));
  }
  // Labels are the next token; the key itself is random, so its first copy is not predicted.
  for (int64_t i = 0; i < seqlen; ++i)
    sample.labels.push_back(i + 1 < seqlen && i + 1 >= key_length ? sample.tokens[static_cast<size_t>(i + 1)] : -100);
  return sample;
}

PlanOptions executor_plan(const TrainingOptions& options, int64_t sp, int zero_stage, bool offload_optimizer) {
  PlanOptions plan;
  plan.sp = sp;
  plan.zero_stage = zero_stage;
  plan.offload_optimizer = offload_optimizer;
  plan.activation_checkpointing = options.activation_checkpointing;
  plan.checkpoint_offload = options.checkpoint_offload;
  plan.tiled_mlp = options.mlp_tiles > 0;
  plan.mlp_tiles = options.mlp_tiles;
  plan.tiled_loss = options.loss_tiles > 0;
  plan.loss_tiles = options.loss_tiles;
  return plan;
}

ClusterSpec executor_cluster(double budget_bytes, int64_t ranks) {
  HardwareCard cpu;
  cpu.name = "cpu-device";
  cpu.gpu_memory_gib = std::isfinite(budget_bytes) ? budget_bytes / (1024.0 * 1024.0 * 1024.0) : 1e6;
  cpu.gpus_per_node = ranks;
  cpu.host_memory_gib = 1e6;
  return cluster_make(cpu, ranks, 1, ranks, 0);
}

Sample sample_from_text(const std::string& text, int64_t seqlen, int64_t offset) {
  if (text.empty()) throw ConfigError("--data", "", "the text file is empty");
  Sample sample;
  const auto size = static_cast<int64_t>(text.size());
  for (int64_t i = 0; i <= seqlen; ++i) {
    const auto byte = static_cast<unsigned char>(text[static_cast<size_t>((offset + i) % size)]);
    if (i < seqlen) {
      sample.tokens.push_back(byte);
      sample.positions.push_back(static_cast<int32_t>(i));
    }
    if (i > 0) sample.labels.push_back(byte);
  }
  return sample;
}

}  // namespace longseq
