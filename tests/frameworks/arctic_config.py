"""One rank of ArcticTraining's own config loader (arctic_training.config.trainer.get_config) reading
a recipe longseq wrote, in a gloo world of the planned size on DeepSpeed's CPU accelerator (the
loader's validation calls deepspeed.init_distributed and reads the world size). Rank 0 prints the
values the test compares, as JSON on a line starting "ARCTIC ".

wandb (which arctic_training/trainer/trainer.py imports for logging, and which pulls in
OpenTelemetry and the rest) is stubbed: the config loader uses none of it.

Usage: python -m torch.distributed.run --nproc-per-node N arctic_config.py RECIPE"""
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

for name in ["wandb", "wandb.sdk", "wandb.sdk.wandb_run"]:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = module
sys.modules["wandb.sdk.wandb_run"].Run = type("Run", (), {})

from arctic_training.config.trainer import get_config  # noqa: E402

config = get_config(Path(sys.argv[1]))
if int(os.environ["RANK"]) == 0:
    print("ARCTIC " + json.dumps({"type": config.type, "sequence_parallel_size": config.sequence_parallel_size,
                                  "world_size": config.world_size, "deepspeed": config.deepspeed,
                                  "max_length": config.data.max_length, "attn_implementation": config.model.attn_implementation,
                                  "gradient_accumulation_steps": config.gradient_accumulation_steps,
                                  "hf_config_kwargs": config.model.hf_config_kwargs}),
          flush=True)
