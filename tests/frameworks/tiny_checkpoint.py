"""A tiny Llama checkpoint on disk, with a tokenizer and a dataset beside it, for running an
exported script as written (no hub: the word-level tokenizer and the data are made here)."""
import json
import os
import random

import torch
from tiny_models import ARCHITECTURES


def tiny_checkpoint(folder, architecture="llama", samples=16, words=200):
    """Writes config.json, the weights, a tokenizer and data/train.jsonl ({"text": ...}) into
    `folder`; returns the data folder (load_dataset reads it as its train split)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    os.makedirs(folder, exist_ok=True)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, 256)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    config = ARCHITECTURES[architecture]
    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    hf_config.architectures = config["architectures"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16).save_pretrained(folder)
    data = os.path.join(folder, "data")
    os.makedirs(data, exist_ok=True)
    rng = random.Random(0)
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        for _ in range(samples):
            f.write(json.dumps({"text": " ".join(f"w{rng.randint(4, 255)}" for _ in range(words))}) + "\n")
    return data
