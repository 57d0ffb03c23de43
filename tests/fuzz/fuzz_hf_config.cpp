// Hugging Face config.json (models/model_loader.cpp).
#include "models/model_loader.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({
  const longseq::ModelSpec model = longseq::model_from_hf_config_text(text, "config.json");
  (void)longseq::parameter_count(model);
})
