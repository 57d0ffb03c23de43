"""Trains two steps of a plain deepspeed.initialize loop (what `--emit deepspeed` writes its JSON
for) on DeepSpeed's CPU accelerator: launched by torchrun on 2 processes, the JSON (argv[2]) as
written, a tiny checkpoint (argv[1]) trained on the first rows of its data at argv[4] tokens;
writes what it saw to argv[3]. DeepSpeed's CPU accelerator talks over gloo where oneCCL is absent.

With sequence_parallel_size > 1 in the JSON, the loop is what the export's notes tell a user to
write (ALST, Reference §3): UlyssesSPAttentionHF.register_with_transformers before the model is
loaded, its mpu given to deepspeed.initialize, the data through UlyssesSPDataLoaderAdapter (each
sample sharded over the Ulysses ranks, labels shifted before sharding), and the loss as ALST
computes it: each rank's mean over its shard's tokens, weighted by its token count over the group
(torch.distributed.nn's all_gather, so gradients flow back)."""
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
    sp = config.get("sequence_parallel_size", 1)
    mpu = None
    if sp > 1:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=folder, core_attn_implementation="sdpa", sequence_parallel_size=sp,
            micro_batch_size=config["train_micro_batch_size_per_gpu"], seq_length=tokens, seq_length_is_variable=True)
    # transformers' way outside the Trainer: a live HfDeepSpeedConfig makes from_pretrained build the
    # model under deepspeed.zero.Init for stage 3 and load each weight into its partition.
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                           config=config, mpu=mpu)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = [json.loads(line)["text"] for line in open(os.path.join(folder, "data", "train.jsonl"))]
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if sp > 1:
        losses = ulysses_steps(engine, mpu, tokenizer, rows, rank, tokens)
    else:
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
                       "sequence_parallel_size": mpu.get_sequence_parallel_world_size() if mpu else 1,
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


def ulysses_steps(engine, mpu, tokenizer, rows, rank, tokens):
    """Two steps of ALST's loop; returns the group's losses (equal on every rank of the group)."""
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    group, sp = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_world_size()
    # One sample a rank; the adapter gathers the group's and hands out each one's shards in turn.
    ids = tokenizer(rows[rank], return_tensors="pt").input_ids[:, :tokens]
    samples = [{"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(ids.shape[1]).unsqueeze(0)}]
    loader = UlyssesSPDataLoaderAdapter(samples, sp_rank=mpu.get_sequence_parallel_rank(), sp_group=group, sp_world_size=sp,
                                        device=torch.device("cpu"))
    losses = []
    for _ in range(2):
        batch = next(loader)
        shift_labels = batch.pop("shift_labels")
        logits = engine(**batch).logits
        shard_loss = engine.module.loss_function(logits=logits, labels=None, shift_labels=shift_labels,
                                                 vocab_size=engine.module.config.vocab_size)
        shard_tokens = (shift_labels != -100).sum()
        shard_losses = torch.distributed.nn.functional.all_gather(shard_loss, group=group)
        tokens_per_shard = torch.distributed.nn.functional.all_gather(shard_tokens, group=group)
        loss = sum(loss * count for loss, count in zip(shard_losses, tokens_per_shard)) / sum(tokens_per_shard)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    main()
