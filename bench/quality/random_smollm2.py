"""A SmolLM2-135M-shaped target with random weights at /tmp/rand-smollm2 (or argv[1]), for
timings that do not depend on the weights: config and tokenizer from .weights15/smollm2-shape."""

import shutil
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/rand-smollm2"
config = AutoConfig.from_pretrained(".weights15/smollm2-shape")
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config).save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(f".weights15/smollm2-shape/{name}", out)
