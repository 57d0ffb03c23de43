"""Every --emit target's files, read by the code of the framework they are for (its newest release in
requirements.txt): DeepSpeed's DeepSpeedConfig in a world of the planned size, Accelerate's own
launch path (its config loader, the environment `accelerate launch` builds, ParallelismConfig and the
FSDP plugin built from it), TRL's SFTConfig, PEFT's LoraConfig and transformers' BitsAndBytesConfig
from the scripts' arguments, torchtitan 0.2.2's ConfigManager. A key a framework refuses, or a value
it reads otherwise than planned, fails a test. Two jobs also train two steps as written: the HF
Trainer script in one process, and the Accelerate FSDP2 YAML under `accelerate launch` on two gloo
processes (fsdp2_on_cpu.py), and the DeepSpeed JSON under ZeRO-3 on two (deepspeed_on_cpu.py).
scripts/frameworks-check.sh runs this file with the newest releases, then with the floor releases
the exports state laid over them: transformers 5's (requirements-floor.txt, and the FSDP2 export's
requirements-floor-fsdp2.txt) and transformers 4's (requirements-floor-transformers4.txt), each
plan under the floors its own export states (emit).

ArcticTraining (0.8.0 requires transformers < 5) is read in the transformers 4 floor stage, whose
overlay installs it; the other stages skip it. Not here: Megatron-DeepSpeed (not on PyPI), Unsloth
(needs CUDA)."""
import ast
import json
import os
import re
import subprocess
import sys
import unittest.mock as mock

import pytest
from packaging.version import Version


def emit(longseq_binary, tmp_path, target, flags, suffix):
    """The export's files and its notes. Under a floor stage whose transformers is older than the
    export states (its notes' "transformers >= X"), the test is skipped: the stage of that floor
    holds it."""
    out = tmp_path / f"{target}{suffix}"
    args = [longseq_binary, "plan", "--emit", target, "--emit-out", str(out), "--overwrite", *flags]
    run = subprocess.run(args, capture_output=True, text=True)
    assert run.returncode == 0, f"{' '.join(args)}: {run.stderr}"
    stated = [Version(v) for v in re.findall(r"transformers >= ([0-9]+(?:\.[0-9]+)*)", run.stderr)]
    import transformers
    if stated and Version(transformers.__version__) < max(stated):
        pytest.skip(f"the export states transformers >= {max(stated)}; this stage has {transformers.__version__}")
    return out, run.stderr


def deepspeed_config(path, world_size):
    """DeepSpeed's own reading of a JSON in a process group of `world_size` ranks."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig
    with mock.patch("deepspeed.comm.get_world_size", return_value=world_size), mock.patch("deepspeed.comm.get_rank", return_value=0):
        return DeepSpeedConfig(json.loads(path.read_text()))


# (plan flags, GPUs): one GPU, a node, two nodes; ZeRO stages and offloads; Ulysses; Ulysses x ring.
DEEPSPEED_PLANS = [
    (["--model", "llama-3.1-8b", "--gpus", "1"], 1),
    (["--model", "llama-3.1-8b", "--gpus", "8"], 8),
    (["--model", "llama-3.1-70b", "--gpus", "16", "--nodes", "2"], 16),
    (["--model", "qwen3-4b", "--gpus", "8", "--zero", "2", "--sp", "4", "--seqlen", "64K"], 8),
    (["--model", "qwen3-4b", "--gpus", "8", "--zero", "1", "--no-offload-optimizer", "--sp", "2", "--seqlen", "32K"], 8),
    # A global batch of 32 over dp = 2: 16 accumulation steps, in DeepSpeed's own batch check.
    (["--model", "qwen3-4b", "--gpus", "8", "--zero", "2", "--sp", "4", "--seqlen", "64K", "--global-batch", "32"], 8),
]


@pytest.mark.parametrize("flags,gpus", DEEPSPEED_PLANS)
def test_deepspeed_json_accepted_by_deepspeed(flags, gpus, longseq_binary, tmp_path):
    path, _ = emit(longseq_binary, tmp_path, "deepspeed", flags + ["--framework", "deepspeed"], ".json")
    config = deepspeed_config(path, gpus)
    planned = json.loads(path.read_text())
    assert config.zero_optimization_stage == planned["zero_optimization"]["stage"]
    assert config.train_micro_batch_size_per_gpu == planned["train_micro_batch_size_per_gpu"]
    assert config.gradient_accumulation_steps == planned["longseq_plan"]["gradient_accumulation_steps"]
    assert config.train_batch_size == planned["longseq_plan"]["global_batch"]
    assert config.bfloat16_config.enabled


def test_usp_with_a_ring_passes_deepspeeds_batch_check(longseq_binary, tmp_path):
    """Exports issue, item 8: DeepSpeed sees sequence_parallel_size (Ulysses) only, so a ring's
    ranks count as data-parallel replicas in its batch check."""
    path, notes = emit(longseq_binary, tmp_path, "usp",
                       ["--model", "../data/hf/qwen2.5-7b.config.json", "--gpus", "8", "--framework", "usp"], ".json")
    planned = json.loads(path.read_text())
    assert planned["longseq_plan"]["plan"].startswith("sp=4 ring=2")
    deepspeed_config(path, 8)
    assert "set_seq_parallel_pg(4, 2" in notes


def accelerate_launch_environment(path):
    """What `accelerate launch --config_file PATH train.py` builds from the YAML: its checked
    arguments and the environment the training process gets."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, mixed_precision_from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # as accelerate's launch_command does before deepspeed_launcher
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        args.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] if mixed_precision_from_config else []))
        return args, prepare_deepspeed_cmd_env(args)[1]
    return args, prepare_multi_gpu_env(args)


def adapter_notes_check(notes, qlora):
    """An adapter plan's notes (exporters' adapter_notes): PEFT's LoraConfig with the plan's rank on
    Llama's 7 linears, and for QLoRA a BitsAndBytesConfig with NF4 and bf16 quant storage (the
    storage ZeRO-3 and FSDP2 shard), each built by the library from the arguments as written
    (parsed as literals, never run)."""
    from peft import LoraConfig
    call = ast.parse(re.search(r"LoraConfig\(.*?\)\)", notes).group(0)[:-1], mode="eval").body
    lora = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}
    assert LoraConfig(**lora).r == 16 and len(lora["target_modules"]) == 7
    if not qlora:
        return
    import importlib.util
    import torch
    import transformers
    from transformers import BitsAndBytesConfig
    call = ast.parse(re.search(r"BitsAndBytesConfig\(.*?\)\)", notes).group(0)[:-1], mode="eval").body
    arguments = {keyword.arg: (getattr(torch, keyword.value.attr) if isinstance(keyword.value, ast.Attribute)
                               else ast.literal_eval(keyword.value)) for keyword in call.keywords}
    if Version(transformers.__version__).major >= 5 or importlib.util.find_spec("bitsandbytes"):
        quantization = BitsAndBytesConfig(**arguments)
        assert quantization.bnb_4bit_quant_storage == torch.bfloat16 and quantization.bnb_4bit_quant_type == "nf4"
    else:  # transformers 4's BitsAndBytesConfig asks bitsandbytes' version to be built, and this stage has none
        assert arguments["bnb_4bit_quant_storage"] == torch.bfloat16 and arguments["bnb_4bit_quant_type"] == "nf4"


@pytest.mark.parametrize("flags,gpus", [(["--model", "llama-3.1-8b", "--gpus", "8"], 8),
                                        (["--model", "llama-3.1-8b", "--gpus", "16", "--nodes", "2"], 16),
                                        # data parallel only: the export's transformers 4 floor
                                        (["--model", "llama-3.1-8b", "--gpus", "8", "--sp", "1", "--seqlen", "16K"], 8),
                                        # adapters beside ZeRO-3 offload (issue 40): PEFT's LoraConfig in the notes
                                        (["--model", "llama-3.1-8b", "--gpus", "8", "--lora", "16", "--zero", "3", "--offload-optimizer",
                                          "--offload-params", "--seqlen", "256K"], 8),
                                        # QLoRA's 4-bit base partitioned by ZeRO-3: bf16 quant storage (issue 40)
                                        (["--model", "llama-3.1-8b", "--gpus", "8", "--lora", "16", "--qlora", "--zero", "3",
                                          "--seqlen", "256K"], 8)])
def test_accelerate_deepspeed_yaml_and_json(flags, gpus, longseq_binary, tmp_path):
    path, notes = emit(longseq_binary, tmp_path, "accelerate", flags + ["--framework", "hf-accelerate"], ".yaml")
    if "--lora" in flags:
        adapter_notes_check(notes, qlora="--qlora" in flags)
        planned = json.loads(path.with_name(path.stem + ".deepspeed.json").read_text())
        if "--qlora" in flags:
            assert planned["zero_optimization"]["stage"] == 3
        else:
            assert planned["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
            assert planned["zero_optimization"]["offload_param"]["device"] == "cpu"
    args, environment = accelerate_launch_environment(path)
    assert args.use_deepspeed and args.num_processes == gpus
    from accelerate.parallelism_config import ParallelismConfig
    with mock.patch.dict(os.environ, environment):
        parallelism = ParallelismConfig()
    planned = json.loads(path.with_name(path.stem + ".deepspeed.json").read_text())
    assert parallelism.sp_size == planned["longseq_plan"]["sp"]
    assert parallelism.dp_shard_size * parallelism.sp_size == gpus
    # The JSON beside it, as the HF Trainer fills its "auto" values for that world (dp x micro).
    filled = dict(planned, train_batch_size=gpus // parallelism.sp_size, train_micro_batch_size_per_gpu=1,
                  gradient_accumulation_steps=1, gradient_clipping=1.0)
    path.with_name("filled.json").write_text(json.dumps(filled))
    deepspeed_config(path.with_name("filled.json"), gpus)


FSDP2_PLANS = [
    (["--model", "qwen3-8b", "--gpus", "8", "--seqlen", "256K"], 8),
    (["--model", "llama-3.1-8b", "--gpus", "32", "--dp-replicate", "2"], 32),  # exports issue, item 2
    (["--model", "qwen3-4b", "--gpus", "8", "--seqlen", "16K", "--ring", "1", "--zero", "3", "--checkpointing"], 8),
    # FSDP-QLoRA: the 4-bit base sharded through bf16 quant storage (issue 40)
    (["--model", "llama-3.1-8b", "--gpus", "8", "--seqlen", "256K", "--lora", "16", "--qlora"], 8),
]


@pytest.mark.parametrize("flags,gpus", FSDP2_PLANS)
def test_accelerate_fsdp2_yaml_builds_its_parallelism_and_plugin(flags, gpus, longseq_binary, tmp_path):
    path, notes = emit(longseq_binary, tmp_path, "accelerate-fsdp2", flags + ["--framework", "accelerate-fsdp2"], ".yaml")
    args, environment = accelerate_launch_environment(path)
    assert args.num_processes == gpus
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    with mock.patch.dict(os.environ, environment):
        parallelism = ParallelismConfig()  # its __post_init__ refuses what Accelerate refuses
        plugin = FullyShardedDataParallelPlugin()
    assert parallelism.total_size == gpus
    assert plugin.fsdp_version == 2
    if parallelism.cp_size == 1:
        assert "pad_to_multiple_of" not in notes  # exports issue, item 11
        assert not re.search(r"\bCP\b", notes)  # issue 41, item 8
    if "--lora" in flags:
        adapter_notes_check(notes, qlora="--qlora" in flags)


def script_constants(path):
    """The names a Python script binds to literals at its top level (MODEL, MAX_SEQ_LENGTH)."""
    tree = ast.parse(path.read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)}


def script_calls(path):
    """The keyword arguments of each call in a Python script, by the called name (literals only;
    names the script defines, MAX_SEQ_LENGTH or MODEL, are resolved; torch.bfloat16 becomes torch's)."""
    import torch
    tree = ast.parse(path.read_text())
    constants = script_constants(path)
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            kwargs = {}
            for keyword in node.keywords:
                value = keyword.value
                if isinstance(value, ast.Name) and value.id in constants:
                    kwargs[keyword.arg] = constants[value.id]
                elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "torch":
                    kwargs[keyword.arg] = getattr(torch, value.attr)
                else:
                    try:
                        kwargs[keyword.arg] = ast.literal_eval(value)
                    except ValueError:
                        kwargs[keyword.arg] = None  # a name bound at run time (model, quantization)
            calls[name] = kwargs
    return calls


SCRIPT_PLANS = [
    ["--model", "llama-3.1-8b", "--gpus", "1", "--lora", "16"],
    ["--model", "llama-3.1-8b", "--gpus", "1", "--lora", "16", "--lora-targets", "q,v", "--qlora"],
    ["--model", "qwen3-4b", "--gpus", "1", "--seqlen", "16K"],
    ["--model", "qwen3-4b", "--gpus", "1", "--seqlen", "16K", "--adam-8bit"],
]


@pytest.mark.parametrize("flags", SCRIPT_PLANS)
def test_hf_trainer_script_arguments_accepted(flags, longseq_binary, tmp_path):
    path, _ = emit(longseq_binary, tmp_path, "hf-trainer", flags + ["--framework", "hf-trainer"], ".py")
    calls = script_calls(path)
    from trl import SFTConfig
    # use_cpu: this machine has no GPU to check bf16=True against (the arguments are the script's).
    sft = dict(calls["SFTConfig"], output_dir=str(tmp_path / "out"), use_cpu=True)
    config = SFTConfig(**sft)
    assert config.max_length == sft["max_length"]
    if "LoraConfig" in calls:
        from peft import LoraConfig
        lora = LoraConfig(**calls["LoraConfig"])
        assert lora.r == calls["LoraConfig"]["r"]
    if "BitsAndBytesConfig" in calls:
        from transformers import BitsAndBytesConfig
        quantization = BitsAndBytesConfig(**calls["BitsAndBytesConfig"])
        assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "nf4"


@pytest.mark.parametrize("seqlen,factor", [("128K", 4), ("32K", None)])
def test_hf_trainer_yarn_past_the_trained_positions_is_transformers_yarn(seqlen, factor, longseq_binary, tmp_path):
    """Issue 40: past the model's max_position_embeddings (Qwen3-1.7B: 40,960) the script loads the model with
    YaRN over that window, factor ceil(S / window) as TRL's 1M example sets it; transformers' own config and rope
    initialisation read it as YaRN with that factor (transformers 5 standardizes rope_scaling into rope_parameters)."""
    path, _ = emit(longseq_binary, tmp_path, "hf-trainer",
                   ["--model", "../data/hf/qwen3-1.7b.config.json", "--gpus", "1", "--seqlen", seqlen, "--framework", "hf-trainer"], ".py")
    loading = script_calls(path)["from_pretrained"]
    if factor is None:
        assert "rope_scaling" not in loading
        return
    assert loading["rope_scaling"] == {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": 40960,
                                       "rope_theta": 1e6}
    import shutil
    from transformers import AutoConfig
    folder = tmp_path / "model"
    folder.mkdir()
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copy(os.path.join(here, "..", "data", "hf", "qwen3-1.7b.config.json"), folder / "config.json")
    config = AutoConfig.from_pretrained(str(folder), rope_scaling=loading["rope_scaling"])
    rope = getattr(config, "rope_parameters", None) or config.rope_scaling
    assert rope["rope_type"] == "yarn" and rope["factor"] == factor
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    inverse_frequencies, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    assert attention_factor > 1.0  # YaRN's 0.1 ln(factor) + 1 attention scaling is on
    assert inverse_frequencies.shape[0] == config.head_dim // 2


def test_unsloth_script_sft_arguments_accepted(longseq_binary, tmp_path):
    path, notes = emit(longseq_binary, tmp_path, "unsloth", ["--model", "llama-3.1-8b", "--gpus", "1", "--lora", "16", "--qlora",
                                                               "--framework", "unsloth"], ".py")
    from trl import SFTConfig
    SFTConfig(**dict(script_calls(path)["SFTConfig"], output_dir=str(tmp_path / "out"), use_cpu=True))
    assert "TRL 0.24" in notes  # exports issue, item 10


@pytest.mark.parametrize("flags", [["--model", "llama-3.1-8b", "--gpus", "8"], ["--model", "qwen3-14b", "--gpus", "8"],
                                   ["--model", "qwen3-14b", "--gpus", "8", "--seqlen", "64K", "--global-batch", "64"],
                                   ["--model", "llama-3.1-70b", "--gpus", "32", "--dp-replicate", "2"]])
def test_torchtitan_toml_parsed_by_torchtitan(flags, longseq_binary, tmp_path):
    path, _ = emit(longseq_binary, tmp_path, "torchtitan", flags + ["--framework", "torchtitan"], ".toml")
    from torchtitan.config import ConfigManager
    config = ConfigManager().parse_args(["--job.config_file", str(path)])
    tp, cp = config.parallelism.tensor_parallel_degree, config.parallelism.context_parallel_degree
    assert config.training.seq_len % (tp * 2 * cp) == 0  # parallelize_llama's assert (exports issue, item 5)
    assert config.training.dataset in ("c4", "c4_test", "c4_validation")  # its registered names (item 11)
    assert config.model.name in ("llama3", "qwen3")
    # train.py's accumulation: global_batch_size / (local_batch_size x the data-parallel degree).
    text = path.read_text()
    dp = int(re.search(r"sp=\d+ dp=(\d+)", text).group(1))
    steps = re.search(r"x (\d+) accumulation steps", text)
    if config.training.global_batch_size > 0:
        assert config.training.global_batch_size % (config.training.local_batch_size * dp) == 0
        assert config.training.global_batch_size // (config.training.local_batch_size * dp) == int(steps.group(1))
    else:
        assert steps is None


def test_torchtitan_layer_selective_checkpointing_wraps_the_planned_layers(longseq_binary, tmp_path):
    """Issue 40: --checkpoint-every 2 is torchtitan's layer-selective AC; its own _apply_layer_sac, applied
    to the 32 blocks of the planned Llama-3.1-8B as torchtitan applies it, wraps the layers the plan
    checkpoints (0-based 1, 3, ..., 31: its counter starts at 1)."""
    path, _ = emit(longseq_binary, tmp_path, "torchtitan", ["--model", "llama-3.1-8b", "--gpus", "8", "--ring", "8", "--zero", "3",
                                                            "--checkpointing", "--checkpoint-every", "2", "--no-offload-optimizer",
                                                            "--no-offload-params", "--no-tiled-mlp", "--no-tiled-loss",
                                                            "--seqlen", "64K", "--framework", "torchtitan"], ".toml")
    assert "+checkpointing(1 in 2)" in path.read_text()
    from torchtitan.config import ConfigManager
    config = ConfigManager().parse_args(["--job.config_file", str(path)])
    assert config.activation_checkpoint.mode == "selective" and config.activation_checkpoint.selective_ac_option == "2"
    import torch
    from torchtitan.distributed import activation_checkpoint
    activation_checkpoint._layer_sac_count = 0
    wrapped = [i for i in range(32)
               if activation_checkpoint._apply_layer_sac(torch.nn.Linear(2, 2), config.activation_checkpoint).__class__ is not torch.nn.Linear]
    assert wrapped == list(range(1, 32, 2))


def script_for_two_cpu_steps(path, data, tmp_path):
    """An exported SFTTrainer script made runnable here with the least change: the dataset placeholder
    replaced by `data`, and SFTConfig given use_cpu (this machine has no GPU), two steps and an output
    folder under tmp_path. Everything else runs as written."""
    script = path.read_text()
    assert script.count('"REPLACE-WITH-YOUR-DATASET"') == 1 and script.count("args = SFTConfig(") == 1
    script = script.replace('"REPLACE-WITH-YOUR-DATASET"', repr(data)).replace(
        "args = SFTConfig(", f"args = SFTConfig(use_cpu=True, max_steps=2, report_to=[], logging_steps=1, output_dir={str(tmp_path / 'out')!r}, "
    ).replace('output_dir="out", ', "")
    path.write_text(script)


@pytest.mark.parametrize("flags", [["--checkpointing"], ["--checkpointing", "--lora", "4"], ["--checkpointing", "--lora", "4", "--lora-targets", "q,v"]])
def test_hf_trainer_script_trains_two_steps(flags, longseq_binary, tmp_path):
    """The exported script run as written on a tiny Llama saved here: only the model path (the
    config.json the plan was made from), the dataset, and use_cpu/max_steps (this machine has no
    GPU) substituted. TRL's SFTTrainer, PEFT and transformers train two steps of it."""
    from tiny_checkpoint import tiny_checkpoint
    data = tiny_checkpoint(str(tmp_path / "tiny"))
    path, _ = emit(longseq_binary, tmp_path, "hf-trainer",
                   ["--model", str(tmp_path / "tiny" / "config.json"), "--gpu", "a100-80gb", "--gpus", "1", "--seqlen", "128",
                    "--framework", "hf-trainer", "--no-tiled-loss", "--no-checkpoint-offload", "--attention", "sdpa", *flags], ".py")
    script_for_two_cpu_steps(path, data, tmp_path)
    run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "'train_loss'" in run.stdout + run.stderr


def trainer_arguments(notes):
    """The Trainer/TRL keyword arguments an Accelerate export names in its notes ("Trainer/TRL
    arguments: name=value ...; TRL: name=value ...; load the model with ..."), as Python values."""
    named = notes.split("Trainer/TRL arguments:", 1)[1].split("; load the model", 1)[0]
    nested_braces = r'\{(?:[^{}]|\{[^{}]*\})*\}'  # accelerator_config={"gradient_accumulation_kwargs": {...}}
    return {name: ast.literal_eval(value) for name, value in re.findall(r'(\w+)=("[^"]*"|' + nested_braces + r'|[^\s;]+)', named)}


def python_path(here):
    """The harnesses' folder ahead of the caller's PYTHONPATH (the floor stage's overlay of older releases)."""
    return os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def accelerate_launch(config, script, *script_args, tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                          "--main_process_port", "0", os.path.join(here, script), *script_args],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=python_path(here), OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-4000:]


@pytest.mark.parametrize("flags", [[], ["--checkpointing", "--no-checkpoint-offload"], ["--global-batch", "4"]])
def test_accelerate_fsdp2_job_trains_two_steps_on_two_processes(flags, longseq_binary, tmp_path):
    """The exported YAML launched as written on 2 CPU processes (gloo), TRL's SFTTrainer with the
    arguments the export names, on a tiny Llama saved here: FSDP2 shards every weight in fp32 over
    the 2 ranks (Accelerate's upcast, Reference §11 F4.4) and trains two steps. Context parallelism
    cannot run on the CPU (fsdp2_on_cpu.py says why)."""
    from tiny_checkpoint import tiny_checkpoint
    tiny_checkpoint(str(tmp_path / "tiny"))
    path, notes = emit(longseq_binary, tmp_path, "accelerate-fsdp2",
                       ["--model", str(tmp_path / "tiny" / "config.json"), "--gpu", "a100-80gb", "--gpus", "2", "--seqlen", "128",
                        "--framework", "accelerate-fsdp2", "--attention", "sdpa", "--no-tiled-loss", *flags], ".yaml")
    arguments = trainer_arguments(notes)
    assert arguments["max_length"] == 128 and arguments["bf16"] is True
    report = tmp_path / "report.json"
    accelerate_launch(path, "fsdp2_on_cpu.py", str(tmp_path / "tiny"), str(report), json.dumps(arguments), tmp_path=tmp_path)
    seen = json.loads(report.read_text())
    assert seen["sharded"] and seen["mesh"] == [2] and seen["shard_dtype"] == "torch.float32"
    assert len(seen["losses"]) == 2 and all(0 < loss < 10 for loss in seen["losses"])
    # A global batch: the Trainer accumulates as planned, reduce-scattering every micro-step
    # (sync_each_batch) so that the gradients stay sharded between them.
    planned_steps = int(re.search(r"x (\d+) accumulation steps", path.read_text()).group(1)) if "--global-batch" in flags else 1
    assert seen["gradient_accumulation_steps"] == planned_steps
    assert seen["sync_each_batch"] == (planned_steps > 1)


FSDP2_SCRIPT_PLANS = [
    ["--model", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--seqlen", "128K"],
    ["--model", "llama-3.1-8b", "--gpus", "8", "--seqlen", "128K", "--lora", "16", "--global-batch", "16"],
    ["--model", "llama-3.1-8b", "--gpus", "8", "--seqlen", "32K", "--lora", "16", "--qlora"],
    ["--model", "qwen3-8b", "--gpus", "8", "--seqlen", "1M"],  # past the trained window: YaRN
]


@pytest.mark.parametrize("flags", FSDP2_SCRIPT_PLANS)
def test_accelerate_fsdp2_script_beside_the_yaml_is_what_trl_accepts(flags, longseq_binary, tmp_path):
    """Issue 41, item 8: the SFTTrainer script beside Accelerate's FSDP2 YAML, read as TRL, PEFT and
    transformers read it: SFTConfig takes every argument, each one the notes name is there with the
    same value, and the model is the one the user named."""
    path, notes = emit(longseq_binary, tmp_path, "accelerate-fsdp2", flags + ["--framework", "accelerate-fsdp2"], ".yaml")
    script = path.with_name(path.stem + ".train.py")
    assert f"--config_file {path} {script}" in notes
    calls = script_calls(script)
    from trl import SFTConfig
    sft = dict(calls["SFTConfig"], output_dir=str(tmp_path / "out"), use_cpu=True)
    config = SFTConfig(**sft)
    for name, value in trainer_arguments(notes).items():
        assert calls["SFTConfig"][name] == value, name
    assert config.max_length == calls["SFTConfig"]["max_length"]
    model_name = script_constants(script)["MODEL"]
    assert model_name == (flags[1] if "/" in flags[1] else {"llama-3.1-8b": "Llama-3.1-8B", "qwen3-8b": "Qwen3-8B"}[flags[1]])
    assert calls["from_pretrained"]["attn_implementation"] == "sdpa"
    if "--lora" in flags:
        from peft import LoraConfig
        assert LoraConfig(**calls["LoraConfig"]).r == 16
    if "--qlora" in flags:
        from transformers import BitsAndBytesConfig
        quantization = BitsAndBytesConfig(**calls["BitsAndBytesConfig"])
        import torch
        assert quantization.bnb_4bit_quant_storage == torch.bfloat16  # FSDP2 shards only a floating storage
    if flags[1] == "qwen3-8b":
        assert calls["from_pretrained"]["rope_scaling"]["rope_type"] == "yarn"


def test_accelerate_fsdp2_script_trains_two_steps_on_two_processes(longseq_binary, tmp_path):
    """The script beside the YAML, run by `accelerate launch` with the YAML as written, on 2 CPU
    processes (gloo) and a tiny Llama saved here: only the dataset and use_cpu/max_steps (no GPU
    here) substituted. FSDP2 shards the weights over the 2 ranks and TRL trains two steps with the
    planned accumulation."""
    from tiny_checkpoint import tiny_checkpoint
    data = tiny_checkpoint(str(tmp_path / "tiny"))
    path, _ = emit(longseq_binary, tmp_path, "accelerate-fsdp2",
                   ["--model", str(tmp_path / "tiny" / "config.json"), "--gpu", "a100-80gb", "--gpus", "2", "--seqlen", "128",
                    "--framework", "accelerate-fsdp2", "--attention", "sdpa", "--no-tiled-loss", "--global-batch", "4"], ".yaml")
    script = path.with_name(path.stem + ".train.py")
    script_for_two_cpu_steps(script, data, tmp_path)
    report = tmp_path / "report.json"
    accelerate_launch(path, "fsdp2_on_cpu.py", "--script", str(script), str(report), tmp_path=tmp_path)
    seen = json.loads(report.read_text())
    assert seen["sharded"] and seen["mesh"] == [2]
    assert len(seen["losses"]) == 2 and all(0 < loss < 10 for loss in seen["losses"])
    assert seen["gradient_accumulation_steps"] == 2 and seen["sync_each_batch"]  # 4 samples over dp = 2


def torchrun(script, *script_args, tmp_path, processes=2, **environment):
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                          os.path.join(here, script), *script_args],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=python_path(here), OMP_NUM_THREADS="1", **environment))
    assert run.returncode == 0, run.stderr[-4000:]
    return run


def test_deepspeed_zero3_json_trains_two_steps_on_two_processes(longseq_binary, tmp_path):
    """The exported DeepSpeed JSON as written, in a plain deepspeed.initialize loop on DeepSpeed's
    CPU accelerator over 2 processes: ZeRO-3 partitions every weight (transformers' HfDeepSpeedConfig
    path) and two steps train; with the optimizer offloaded, DeepSpeed's CPU Adam (built on first use)
    takes the step, and the losses are the same run's (same data, same update rule)."""
    from tiny_checkpoint import tiny_checkpoint
    tiny_checkpoint(str(tmp_path / "tiny"))
    plan = ["--model", str(tmp_path / "tiny" / "config.json"), "--gpu", "a100-80gb", "--gpus", "2", "--seqlen", "128",
            "--framework", "deepspeed", "--attention", "sdpa", "--zero", "3", "--sp", "1",
            "--no-checkpointing", "--no-tiled-mlp", "--no-tiled-loss"]
    seen = {}
    for name, offload in (("on-device", "--no-offload-optimizer"), ("offloaded", "--offload-optimizer")):
        out = tmp_path / name
        out.mkdir()
        path, _ = emit(longseq_binary, out, "deepspeed", plan + [offload], ".json")
        assert json.loads(path.read_text())["train_batch_size"] == 2  # dp = 2 ranks, micro-batch 1
        torchrun("deepspeed_on_cpu.py", str(tmp_path / "tiny"), str(path), str(out / "report.json"), "128", tmp_path=out)
        seen[name] = json.loads((out / "report.json").read_text())
        assert seen[name]["zero_stage"] == 3 and seen[name]["partitioned"]
        assert len(seen[name]["losses"]) == 2 and all(0 < loss < 10 for loss in seen[name]["losses"])
    assert seen["offloaded"]["optimizer"] == "DeepSpeedCPUAdam"
    assert seen["offloaded"]["losses"] == pytest.approx(seen["on-device"]["losses"], rel=1e-2)


def test_deepspeed_ulysses_json_trains_two_steps_on_two_processes(longseq_binary, tmp_path):
    """The exported JSON of a Ulysses plan (sp=2 over 2 processes, ZeRO-3) in the loop its notes ask
    for (deepspeed_on_cpu.py: UlyssesSPAttentionHF, its mpu, UlyssesSPDataLoaderAdapter, ALST's
    loss): DeepSpeed takes its batch (train_batch_size 1: the world is one Ulysses group), two steps
    train with each sequence split over the two ranks and its attention all-to-all'ed, and the first
    step's loss is the whole sequence's as the same loop computes it unsharded (sp=1, the same row
    on rank 0, the same weights) within bf16's rounding."""
    import importlib.metadata
    if Version(importlib.metadata.version("deepspeed")) < Version("0.19.8"):
        # 0.18.2's UlyssesSPDataLoaderAdapter all-gathers each rank's length as a 0-dim tensor, which
        # gloo refuses ("ProcessGroupGloo::allgather: invalid tensor size ... expected (), got (1)");
        # NCCL, what a GPU run uses, moves the bytes. 0.19.8 (the newest stage) sends [1].
        pytest.skip("DeepSpeed's Ulysses data adapter before 0.19.8 cannot run on gloo (NCCL only)")
    from tiny_checkpoint import tiny_checkpoint
    tiny_checkpoint(str(tmp_path / "tiny"))
    plan = ["--model", str(tmp_path / "tiny" / "config.json"), "--gpu", "a100-80gb", "--gpus", "2", "--seqlen", "128",
            "--framework", "deepspeed", "--attention", "sdpa", "--zero", "3", "--no-offload-optimizer",
            "--no-checkpointing", "--no-tiled-mlp", "--no-tiled-loss"]
    seen = {}
    for name, sp in (("unsharded", "1"), ("ulysses", "2")):
        out = tmp_path / name
        out.mkdir()
        path, notes = emit(longseq_binary, out, "deepspeed", plan + ["--sp", sp], ".json")
        written = json.loads(path.read_text())
        assert written.get("sequence_parallel_size", 1) == int(sp) and written["train_batch_size"] == 2 // int(sp)
        torchrun("deepspeed_on_cpu.py", str(tmp_path / "tiny"), str(path), str(out / "report.json"), "128", tmp_path=out)
        seen[name] = json.loads((out / "report.json").read_text())
        assert seen[name]["sequence_parallel_size"] == int(sp) and seen[name]["partitioned"]
        assert len(seen[name]["losses"]) == 2 and all(0 < loss < 10 for loss in seen[name]["losses"])
    assert "UlyssesSPDataLoaderAdapter" in notes
    assert seen["ulysses"]["losses"][0] == pytest.approx(seen["unsharded"]["losses"][0], rel=1e-2)


@pytest.mark.parametrize("flags,gpus", [(["--model", "llama-3.1-8b", "--gpus", "8"], 8),
                                        (["--model", "qwen3-4b", "--gpus", "4", "--zero", "2", "--sp", "2", "--seqlen", "64K"], 4),
                                        # past the trained window (YaRN in hf_config_kwargs), with gradient accumulation
                                        (["--model", "../data/hf/qwen3-1.7b.config.json", "--gpus", "4", "--sp", "2", "--seqlen", "128K",
                                          "--global-batch", "8"], 4)])
def test_arctic_training_recipe_accepted_by_its_config_loader(flags, gpus, longseq_binary, tmp_path):
    """ArcticTraining's get_config on every rank of a gloo world of the planned size (arctic_config.py):
    the recipe as written, but for the model path and dataset (a tiny Llama saved here; no hub) and
    SDPA (its validation imports flash_attn for FlashAttention, which the CPU lacks)."""
    import importlib.util
    if importlib.util.find_spec("arctic_training") is None:  # not imported here: it imports wandb (arctic_config.py)
        pytest.skip("ArcticTraining 0.8 requires transformers < 5: the transformers 4 floor stage installs and reads it")
    from tiny_checkpoint import tiny_checkpoint
    data = tiny_checkpoint(str(tmp_path / "tiny"))
    path, _ = emit(longseq_binary, tmp_path, "arctic-training", flags + ["--framework", "arctic-training", "--attention", "sdpa"], ".yaml")
    recipe = path.read_text()
    assert recipe.count("- REPLACE-WITH-YOUR-DATASET") == 1
    import yaml
    planned = yaml.safe_load(recipe)
    path.write_text(recipe.replace(f"name_or_path: {planned['model']['name_or_path']}", f"name_or_path: {tmp_path / 'tiny'}")
                          .replace("- REPLACE-WITH-YOUR-DATASET", f"- {data}"))
    run = torchrun("arctic_config.py", str(path), tmp_path=tmp_path, processes=gpus, DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    read = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("ARCTIC "))[len("ARCTIC "):])
    assert read["world_size"] == gpus
    assert read["sequence_parallel_size"] == planned["sequence_parallel_size"]
    assert read["deepspeed"]["zero_optimization"]["stage"] == planned["deepspeed"]["zero_optimization"]["stage"]
    # DeepSpeed's batch: micro batch x accumulation x world / sp, as ArcticTraining fills it.
    assert read["gradient_accumulation_steps"] == planned["gradient_accumulation_steps"]
    assert read["deepspeed"]["train_batch_size"] == (planned["micro_batch_size"] * planned["gradient_accumulation_steps"] * gpus
                                                     // planned["sequence_parallel_size"])
    if "--global-batch" in flags:
        assert read["deepspeed"]["train_batch_size"] == 8
    assert read["hf_config_kwargs"] == planned["model"].get("hf_config_kwargs", {})
    assert read["max_length"] == planned["data"]["max_length"] and read["attn_implementation"] == "sdpa"


@pytest.mark.parametrize("architecture,sliding_window", [("mistral", 4096), ("gemma3", 4096), ("llama", None)])
def test_context_parallelism_refusals_are_accelerates(architecture, sliding_window, longseq_binary, tmp_path):
    """Accelerate's own check before it drops every layer's mask for context parallelism
    (big_modeling._attach_context_parallel_hooks refuses sliding-window and chunked layers) and the
    planner's refusal of a cp plan for the same config.json: the same models."""
    import inspect

    import accelerate
    from accelerate.big_modeling import _attach_context_parallel_hooks
    from tiny_models import ARCHITECTURES, build_model
    if "does not support attention layers" not in inspect.getsource(_attach_context_parallel_hooks):
        # 1.12 (the floor stages') drops the mask without looking: such a model would train with full
        # causal attention; the planner refuses the plan all the same.
        pytest.skip(f"Accelerate {accelerate.__version__} drops every layer's mask under cp without refusing sliding windows")
    config = dict(ARCHITECTURES[architecture], sliding_window=sliding_window)
    model = build_model(config)
    try:
        _attach_context_parallel_hooks(model)
        accelerate_refuses = False
    except ValueError as refusal:
        accelerate_refuses = "Context parallelism does not support attention layers" in str(refusal)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    run = subprocess.run([longseq_binary, "plan", "--model", str(path), "--gpus", "2", "--ring", "2", "--seqlen", "1024",
                          "--framework", "accelerate-fsdp2"], capture_output=True, text=True)
    planner_refuses = run.returncode != 0 and "PyTorch's context parallelism runs full causal attention only" in run.stderr
    assert accelerate_refuses == planner_refuses == (sliding_window is not None), (run.stderr, accelerate_refuses)


def test_torchtitan_op_selective_checkpointing_saves_what_the_plan_keeps(longseq_binary, tmp_path):
    """Issue 40: --checkpoint-ops is torchtitan's op-level SAC. Its own apply_ac with its llama3
    _op_sac_save_list, on a tiny llama3 Transformer, decides per mm as the plan prices it
    (decoder_layer_op_selective_saved_bytes): within each layer the outputs of wq, wv, w1 and w2
    saved, those of wk, wo and w3 recomputed; and SDPA's CUDA kernels are in the save list (on this
    CPU the attention runs the CPU kernel, which is not)."""
    path, _ = emit(longseq_binary, tmp_path, "torchtitan", ["--model", "llama-3.1-8b", "--gpus", "8", "--ring", "1", "--zero", "3",
                                                            "--checkpoint-ops", "--no-offload-optimizer", "--no-offload-params",
                                                            "--no-tiled-mlp", "--no-tiled-loss", "--seqlen", "16K",
                                                            "--framework", "torchtitan"], ".toml")
    assert "+checkpointing(ops)" in path.read_text()
    from torchtitan.config import ConfigManager
    config = ConfigManager().parse_args(["--job.config_file", str(path)])
    assert config.activation_checkpoint.mode == "selective" and config.activation_checkpoint.selective_ac_option == "op"
    import torch
    import torch.utils.checkpoint as checkpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer
    assert torch.ops.aten._scaled_dot_product_flash_attention.default in _op_sac_save_list
    assert torch.ops.aten._scaled_dot_product_cudnn_attention.default in _op_sac_save_list

    decisions = []  # (layer forward index, output width, saved?) for every mm of the first forward
    original = checkpoint.create_selective_checkpoint_contexts

    def recording(policy, *args, **kwargs):
        layer = len({d[0] for d in decisions})

        def wrapped(ctx, func, *func_args, **func_kwargs):
            decision = policy(ctx, func, *func_args, **func_kwargs)
            if func == torch.ops.aten.mm.default and not ctx.is_recompute:
                decisions.append((layer, func_args[1].shape[1], decision == checkpoint.CheckpointPolicy.MUST_SAVE))
            return decision
        return original(wrapped, *args, **kwargs)

    torch.manual_seed(0)
    model_args = TransformerModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=32)
    model = Transformer(model_args)
    with torch.no_grad():
        model.init_weights()
    checkpoint.create_selective_checkpoint_contexts = recording
    try:
        apply_ac(model, config.activation_checkpoint, op_sac_save_list=_op_sac_save_list)
        model(torch.randint(0, 128, (1, 32))).float().sum().backward()
    finally:
        checkpoint.create_selective_checkpoint_contexts = original
    block = model.layers["0"]
    inner = getattr(block, "_checkpoint_wrapped_module", block)
    attention, mlp = inner.attention, inner.feed_forward
    widths = [attention.wq.out_features, attention.wk.out_features, attention.wv.out_features, attention.wo.out_features,
              mlp.w1.out_features, mlp.w3.out_features, mlp.w2.out_features]
    for layer in (0, 1):
        seen = [(width, saved) for l, width, saved in decisions if l == layer]
        assert seen == list(zip(widths, [True, False, True, False, True, False, True])), seen
