// YAML cards: model cards, hardware cards and runtime profiles (models/, planner/cards.cpp).
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({
  try {
    const longseq::ModelSpec model = longseq::model_from_card_text(text, "card.yaml");
    (void)longseq::parameter_count(model);  // validated shapes must not overflow it
  } catch (const longseq::ConfigError&) {
  }
  try {
    (void)longseq::hardware_card_from_text(text, "hardware.yaml");
  } catch (const longseq::ConfigError&) {
  }
  (void)longseq::runtime_profile_from_text(text, "profile.yaml");
})
