// A scenario as `longseq run` reads it (planner/scenario.cpp: scenario_run_options): every plan key
// the file sets is either carried into run's options with its value or refused with a ConfigError
// naming it; a key set and silently dropped (the reliability issue's item 6: lora_rank, qlora,
// ring, offload_params, fpdt trained the full model with exit 0) aborts.
#include "planner/scenario.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

namespace {

void run_options_check(const std::string& text) {
  const longseq::Scenario scenario = longseq::scenario_from_text(text, "scenario.yaml");
  if (!scenario.run) return;
  const longseq::ScenarioRunOptions options = longseq::scenario_run_options(scenario);
  const longseq::PlanSettings& plan = scenario.plan;
  const char* dropped = nullptr;
  if (plan.activation_checkpointing != options.checkpointing) dropped = "activation_checkpointing";
  if (plan.checkpoint_offload != options.checkpoint_offload) dropped = "checkpoint_offload";
  if (plan.offload_optimizer != options.offload_optimizer) dropped = "offload_optimizer";
  if (plan.offload_params != options.offload_params) dropped = "offload_params";
  if (plan.sp != options.sp) dropped = "sp";
  if (plan.ring != options.ring) dropped = "ring";
  if (plan.zero_stage && options.zero_stage != *plan.zero_stage) dropped = "zero_stage";
  if (plan.lora_rank != options.lora_rank) dropped = "lora_rank";
  if (plan.lora_all_linear != options.lora_all_linear) dropped = "lora_targets";
  if (plan.mlp_tiles && options.mlp_tiles != plan.mlp_tiles) dropped = "mlp_tiles";
  if (plan.tiled_mlp.value_or(false) && options.mlp_tiles.value_or(0) < 1) dropped = "tiled_mlp";
  if (plan.loss_tiles && options.loss_tiles != plan.loss_tiles) dropped = "loss_tiles";
  if (plan.tiled_loss.value_or(false) && options.loss_tiles.value_or(0) < 1) dropped = "tiled_loss";
  if (plan.fpdt.value_or(false) && !options.fpdt_chunk_tokens) dropped = "fpdt";
  if (plan.fpdt_chunk_tokens && options.fpdt_chunk_tokens != plan.fpdt_chunk_tokens) dropped = "fpdt_chunk_tokens";
  if (plan.qlora.value_or(false) || plan.preset || plan.search || plan.framework) dropped = "a key run refuses";
  if (dropped) {
    std::fprintf(stderr, "fuzz: run dropped plan.%s\n", dropped);
    std::abort();
  }
}

}  // namespace

LONGSEQ_FUZZ_TARGET({ run_options_check(text); })
