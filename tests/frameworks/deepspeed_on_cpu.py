"""Trains two steps of a plain deepspeed.initialize loop (what `--emit deepspeed` writes its JSON
for) on DeepSpeed's CPU accelerator: launched by torchrun on 2 processes, the JSON (argv[2]) as
written, a tiny checkpoint (argv[1]) trained on the first rows of its data at argv[4] tokens;
writes what it saw to argv[3]. DeepSpeed's CPU accelerator talks over gloo where oneCCL is absent."""
import faulthandler
import json
import os
import resource
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# A hang prints every thread's stack and ends the process, so a test fails with where it waited
# (600 s: a first run builds DeepSpeed's CPU Adam or fused Adam, minutes on 2 busy cores).
faulthandler.dump_traceback_later(int(os.environ.get("LONGSEQ_HANG_S", "600")), exit=True)


def main():
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations import HfDeepSpeedConfig
    folder, config_path, report, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    deepspeed.init_distributed(dist_backend="gloo")
    config = json.load(open(config_path))
    stage = config["zero_optimization"]["stage"]
    # transformers' way outside the Trainer: a live HfDeepSpeedConfig makes from_pretrained build the
    # model under deepspeed.zero.Init for stage 3 and load each weight into its partition.
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                           config=config)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = [json.loads(line)["text"] for line in open(os.path.join(folder, "data", "train.jsonl"))]
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    losses = []
    for step in range(2):
        ids = tokenizer(rows[step * world + rank], return_tensors="pt").input_ids[:, :tokens]
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if rank == 0:
        with open(report, "w") as f:
            json.dump({"losses": losses, "deepspeed": deepspeed.__version__, "zero_stage": engine.zero_optimization_stage(),
                       "optimizer": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__,
                       "partitioned": stage == 3 and all(hasattr(p, "ds_id") for p in engine.module.parameters()),
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
    main()
