#!/usr/bin/env python3
"""Every --emit target, written from a config.json whose _name_or_path is hostile into a folder
whose name is hostile, read back by the parser its framework uses (Python's ast, bash, tomllib,
PyYAML, json) and compared with the same export from a benign name and folder: the same statements
and keys, the hostile text only inside strings and comments. The Megatron-DeepSpeed script is run by
bash with a stand-in `deepspeed` on PATH: no command but it runs, and it gets the JSON's path as one
argument.

usage: export_hostile.py LONGSEQ_BINARY
"""
import ast
import json
import os
import subprocess
import sys
import tempfile

try:
    import tomllib
    import yaml
except ImportError as missing:  # CTest reports 77 as skipped, visibly
    print(f"export_hostile: SKIPPED, {missing.name} is missing (Python >= 3.11 and PyYAML: scripts/setup.sh installs python3-yaml)")
    sys.exit(77)

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
         "rope_scaling": {"rope_type": "llama3"}, "hidden_act": "silu"}
HOSTILE_NAME = "x\nopen('PWNED-PY','w').write('x')\n#\r\nkey: injected\u2028\"quoted\" \\ end"
HOSTILE_FOLDER = "w s $(touch PWNED-SH) 'q' \"d\""
# (target, extra plan flags, the file kind of the main file)
TARGETS = [("arctic-training", ["--gpus", "8"], "yaml"), ("accelerate", ["--gpus", "16", "--nodes", "2"], "yaml"),
           ("accelerate-fsdp2", ["--gpus", "8"], "yaml"), ("hf-trainer", ["--gpus", "1", "--lora", "16"], "python"),
           ("unsloth", ["--gpus", "1", "--lora", "16"], "python"), ("torchtitan", ["--gpus", "8", "--gpu", "h100"], "toml"),
           ("megatron-deepspeed", ["--gpus", "8"], "shell"), ("deepspeed", ["--gpus", "8"], "json")]
SUFFIX = {"yaml": ".yaml", "python": ".py", "toml": ".toml", "shell": ".sh", "json": ".json"}


def emit(binary, root, folder_name, model_name, target, flags, kind):
    folder = os.path.join(root, folder_name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(dict(LLAMA, _name_or_path=model_name), f)
    out = os.path.join(folder, target + SUFFIX[kind])
    subprocess.run([binary, "plan", "--model", os.path.join(folder, "config.json"), "--seqlen", "32K", *flags, "--emit", target,
                    "--emit-out", out, "--overwrite"], check=True, capture_output=True, cwd=root)
    return out


def strings_blanked(node):
    """A parsed document's shape: keys kept, every string value blanked."""
    if isinstance(node, dict):
        return {key: strings_blanked(value) for key, value in node.items()}
    if isinstance(node, list):
        return [strings_blanked(value) for value in node]
    return "" if isinstance(node, str) else node


def python_shape(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def shape(path, kind):
    if kind == "python":
        return python_shape(path)
    if kind == "toml":
        return strings_blanked(tomllib.load(open(path, "rb")))
    if kind == "yaml":
        return strings_blanked(yaml.safe_load(open(path, encoding="utf-8")))
    if kind == "json":
        return strings_blanked(json.load(open(path, encoding="utf-8")))
    subprocess.run(["bash", "-n", path], check=True)
    return None


def main():
    binary = os.path.abspath(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory() as root:
        for target, flags, kind in TARGETS:
            benign = emit(binary, root, "benign folder", "benign/model", target, flags, kind)
            hostile = emit(binary, root, HOSTILE_FOLDER, HOSTILE_NAME, target, flags, kind)
            files = [(benign, hostile, kind)]
            if os.path.exists(os.path.splitext(hostile)[0] + ".deepspeed.json"):
                files.append((os.path.splitext(benign)[0] + ".deepspeed.json", os.path.splitext(hostile)[0] + ".deepspeed.json", "json"))
            for benign_file, hostile_file, file_kind in files:
                try:
                    if shape(benign_file, file_kind) != shape(hostile_file, file_kind):
                        failures.append(f"{target}: {os.path.basename(hostile_file)} holds other statements or keys than the benign file")
                except Exception as error:  # a parse error is the failure to report
                    failures.append(f"{target}: {os.path.basename(hostile_file)} does not parse: {error}")
            if kind == "shell":
                # Run it, `deepspeed` a stand-in that records its arguments.
                bin_dir = os.path.join(root, "bin")
                os.makedirs(bin_dir, exist_ok=True)
                with open(os.path.join(bin_dir, "deepspeed"), "w") as f:
                    f.write('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$ARGS_OUT"\n')
                os.chmod(os.path.join(bin_dir, "deepspeed"), 0o755)
                args_out = os.path.join(root, "deepspeed-args")
                run = subprocess.run(["bash", hostile], cwd=root, capture_output=True, text=True,
                                     env=dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], ARGS_OUT=args_out))
                if run.returncode != 0:
                    failures.append(f"{target}: bash stopped with exit {run.returncode}: {run.stderr.strip()[:200]}")
                    continue
                arguments = open(args_out).read().split("\n")
                expected = os.path.splitext(hostile)[0] + ".deepspeed.json"
                if expected not in arguments:
                    failures.append(f"{target}: deepspeed did not get the JSON's path as one argument")
        # A path that is not UTF-8 cannot be named in the files' strings: refused before any work.
        for flag in ("--emit-out", "--model"):
            bad = os.fsencode(root) + b"/bad\xff"
            os.makedirs(bad, exist_ok=True)
            with open(bad + b"/config.json", "w") as f:
                json.dump(LLAMA, f)
            out = bad + b"/out.json" if flag == "--emit-out" else os.fsencode(root) + b"/out.json"
            args = [binary, "plan", "--gpus", "8", "--emit", "deepspeed", "--emit-out", out]
            args += ["--model", "llama-3.1-8b"] if flag == "--emit-out" else ["--model", bad + b"/config.json"]
            run = subprocess.run(args, capture_output=True)
            if run.returncode != 2 or f"{flag}: the path".encode() not in run.stderr or os.path.exists(out):
                failures.append(f"a {flag} path that is not UTF-8: exit {run.returncode}, {run.stderr[-200:]!r}")
        for name in ("PWNED-PY", "PWNED-SH"):
            for folder, _, files in os.walk(root):
                if name in files:
                    failures.append(f"a file {name} was created: an input text ran as code")
    # The Python scripts are not run (no torch here); their ast holds no call the benign one lacks.
    for failure in failures:
        print("FAIL:", failure)
    print(f"export_hostile: {len(TARGETS)} targets, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
