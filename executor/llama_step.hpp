// llama_step.hpp: BasicLlamaModel's training step, written once over a device's Ops (cpu_ops.hpp
// states what an Ops provides). Included by llama.cpp, which instantiates it for the CPU, and by
// llama_cuda.cpp for the GPU: every allocation, its name and its order, every collective and
// every memory option are this one text, so what the CPU tests prove about the schedule (memory
// measured == predicted, loss and gradients unchanged by each option) holds for the GPU's too.
//
// The step is split by block, each file named as the planner's inventory of the same block
// (models/inventory/): step/attention.hpp, step/moe.hpp, step/lora.hpp, step/layer.hpp (the dense
// MLP with it), step/model.hpp (the states, the loss and the optimizer).
#pragma once

#include "executor/step/model.hpp"
