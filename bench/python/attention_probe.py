"""Which scaled_dot_product_attention calls of a real model's Dynamo graph
the attention policy gives Kiln's fused op, and why not (a diagnostic for
bench/python/real_models.py's models):

    $PY bench/python/attention_probe.py [--device cuda] [--amp bfloat16] \\
        [--scale 16] [--seq 128] hf_gpt2 hf_llama
"""

from __future__ import annotations

import argparse
import contextlib

import bench_util  # noqa: F401 (sys.path, KILN_LIB)

import torch

import kiln
from kiln import attention as A
import real_models as R


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--amp", choices=["bfloat16", "float16"])
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--seq", type=int, default=16)
    a = ap.parse_args()
    R.SEQ, R.SCALE = a.seq, a.scale
    print("kiln.attention in the client library:",
          "kiln.attention.default" in kiln.supported_ops())

    amp_dtype = getattr(torch, a.amp) if a.amp else None

    def backend(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target in A._SDPA_TARGETS:
                vals = [x.meta.get("example_value") for x in n.args[:3]
                        if hasattr(x, "meta")]
                print(f"  {n.name}: kwargs {n.kwargs}, "
                      f"{[(str(v.dtype)[6:], tuple(v.shape)) for v in vals]}, "
                      f"scores {A._scores(n)}, device {A._device(n)}, "
                      f"eligible {A.fused_eligible(n, autocast=amp_dtype)}")
        return gm.forward

    for name in a.names:
        model, inputs = R.MODELS[name]()
        model = model.to(a.device)
        inputs = tuple(x.to(a.device) for x in inputs)
        torch._dynamo.reset()
        print(name)
        amp = (torch.autocast(a.device, dtype=getattr(torch, a.amp))
               if a.amp else contextlib.nullcontext())
        with amp:
            torch.compile(model, backend=backend)(*inputs)


if __name__ == "__main__":
    main()
