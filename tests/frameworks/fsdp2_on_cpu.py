"""Trains two steps of TRL's SFTTrainer under `accelerate launch --config_file <longseq's YAML>` on
the CPU: the exported Accelerate FSDP2 job as a user runs it, with the Trainer/TRL arguments the
export names (argv[3], JSON), on a tiny checkpoint (argv[1]); writes what it saw to argv[2]. With
`--script PATH REPORT`, the training script the export wrote beside the YAML runs instead, as
written but for the substitutions the test makes (the dataset, use_cpu, two steps).

One substitution, because this machine has no GPU: Accelerate builds FSDP only on accelerators
(accelerate/state.py, AcceleratorState.__init__ lists the MULTI_<device> types beside FSDP) and
makes a CPU run MULTI_CPU; the same step then turns that state into FSDP with the plugin Accelerate
built from the YAML, so its FSDP2 path (fully_shard over gloo, its fp32 upcast, mixed precision)
runs as on GPUs. Context parallelism cannot run here: PyTorch registers no sharding strategy for the
CPU's SDPA kernel (aten._scaled_dot_product_flash_attention_for_cpu)."""
import json
import os
import resource
import sys

import accelerate.state
import torch
from accelerate.utils import DistributedType

_accelerator_state_init = accelerate.state.AcceleratorState.__init__


def _fsdp_on_the_cpu(self, *args, fsdp_plugin=None, **kwargs):
    _accelerator_state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
        self.distributed_type = DistributedType.FSDP  # what the accelerator branch of __init__ does
        if self._mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.fsdp_plugin = fsdp_plugin


accelerate.state.AcceleratorState.__init__ = _fsdp_on_the_cpu


def main():
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    folder, report, trainer_arguments = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa")
    # use_cpu: the Trainer refuses bf16 without a GPU otherwise (the arguments are the export's).
    args = SFTConfig(**trainer_arguments, output_dir=report + ".out", max_steps=2, logging_steps=1, report_to=[], use_cpu=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=load_dataset(folder + "/data", split="train"),
                         processing_class=AutoTokenizer.from_pretrained(folder))
    result = trainer.train()
    report_and_exit(trainer, args, result.training_loss, report)


def run_exported_script(script, report):
    """The export's own script, run as `accelerate launch` runs it; its trainer is then read back."""
    import runpy
    namespace = runpy.run_path(script, run_name="__main__")
    trainer = namespace["trainer"]
    losses = [entry["train_loss"] for entry in trainer.state.log_history if "train_loss" in entry]
    report_and_exit(trainer, trainer.args, losses[-1] if losses else None, report)


def report_and_exit(trainer, args, train_loss, report):
    from torch.distributed.tensor import DTensor
    weight = next(trainer.model_wrapped.parameters())
    if torch.distributed.get_rank() == 0:
        with open(report, "w") as f:
            json.dump({"train_loss": train_loss,
                       "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
                       "wrapper": type(trainer.model_wrapped).__name__,
                       "gradient_accumulation_steps": args.gradient_accumulation_steps,
                       "sync_each_batch": trainer.accelerator.gradient_state.plugin_kwargs.get("sync_each_batch", False),
                       "sharded": isinstance(weight, DTensor), "shard_dtype": str(weight.dtype),
                       "mesh": list(weight.device_mesh.shape) if isinstance(weight, DTensor) else None,
                       "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}, f)
    # Left to the interpreter's exit, gloo's threads sometimes outlive the group ("terminate called
    # without an active exception", 1 run in ~8 here): end it while every rank is still here. Even
    # so, a C++ destructor at the interpreter's exit aborted one DeepSpeed run (rank 1, after the
    # group ended): what the run had to say is written, so the process leaves without the teardown.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--script":
        run_exported_script(sys.argv[2], sys.argv[3])
    else:
        main()
