"""Greedy decoding through Kiln: a Hugging Face causal LM's forward
compiled with torch.compile(backend=kiln) inside model.generate() (a KV
cache that grows by a token per call: Dynamo recompiles once, then marks
the length dynamic), against the same model's eager generate(). Prints,
per model, whether the tokens are identical, nodes in Kiln, graphs and
partitions; exits 1 when tokens differ or a call fell back.

    PY=$(bash deploy/python-env.sh)
    bash bench/python/real_models_env.sh          # transformers, once
    KILN_REAL_MODELS_DIR=~/.cache/kiln/real-models \\
        $PY bench/python/generate_check.py [--new-tokens 12]

A private kilnd on an ephemeral port serves (bench_util.Kilnd).
"""

from __future__ import annotations

import argparse
import sys
import time

import real_models  # noqa: F401 (sys.path: KILN_LIB, the libraries)
from bench_util import Kilnd

import torch

import kiln

MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=100, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(
        vocab_size=100, n_embd=64, n_layer=2, n_head=4)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=12)
    a = ap.parse_args()
    import transformers  # noqa: PLC0415

    failed = False
    with Kilnd() as server:
        for name, (model_cls, config_cls, config) in MODELS.items():
            torch.manual_seed(0)
            model = getattr(transformers, model_cls)(
                getattr(transformers, config_cls)(**config)).eval()
            prompt = torch.randint(0, 100, (2, 8))
            kw = dict(max_new_tokens=a.new_tokens, do_sample=False,
                      pad_token_id=0)
            want = model.generate(prompt, **kw)
            torch._dynamo.reset()
            backend = kiln.backend(server=server.address, fallback="eager")
            model.forward = torch.compile(model.forward, backend=backend)
            start = time.perf_counter()
            got = model.generate(prompt, **kw)
            seconds = time.perf_counter() - start
            r = backend.report
            same = torch.equal(want, got)
            failed |= not same or r.fallback_nodes > 0
            print(f"{name}: tokens {'identical' if same else 'DIFFER'}, "
                  f"{r.kiln_nodes}/{r.kiln_nodes + r.fallback_nodes} nodes "
                  f"in Kiln, graphs={r.graphs} "
                  f"partitions={r.compiled_partitions}, {seconds:.1f} s",
                  flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
