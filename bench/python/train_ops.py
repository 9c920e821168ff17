"""The training ops of issue 17, forward + backward, eager against Inductor
and Kiln side by side in one run: an embedding and cross-entropy at a GPT-2
vocabulary, batch norm and group norm at ResNet shapes, dropout at 2^26.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/train_ops.py [--device cuda] [--server HOST:PORT] [--cases a,b]

Rows (float32; the GPU sizes are the issue's, the CPU ones smaller):
  embedding+ce   GPT-2's ends: ids (8, 1024) -> nn.Embedding(50257, 768)
                 -> a tied head (x @ E^T, cuBLASLt / BLAS) -> cross-entropy;
                 backward into the embedding (a scatter-add of 8192 rows
                 plus the head's GEMMs)
  ce             cross-entropy alone over (8192, 50257) logits: log-softmax
                 + gather forward, softmax - one-hot backward
  batch_norm     nn.BatchNorm2d(256) in training mode on (32, 256, 56, 56)
  group_norm     nn.GroupNorm(32, 256) on (32, 256, 56, 56)
  dropout        F.dropout(p=0.1) on 2^26 elements (Philox in Kiln), and
                 its backward (the saved mask)
  positions      BERT-base's position embedding: nn.Embedding(512, 768) on
                 ids (8, 512) (CPU: 64 wide, (8, 64)); its backward is a
                 scatter-add, linear in Kiln (a zeroing and one kernel over
                 the 8 x 512 x 768 sources: atomic on the GPU, in source
                 order on the CPU)
  cumsum         RoBERTa's position ids (mask.cumsum(1) over (8, 512)
                 token ids), their embedding (514 x 768; CPU 64 wide), a
                 cumsum of it along the sequence, and the backward (a
                 flipped cumsum and the embedding's scatter-add): a scan
                 on the CPU, a quadratic reduction on CUDA
Each: median of 7 timings of 10 steps (loss.backward() included; CUDA:
synchronized around them), ms per step. With --rounds N the three are
measured N times in turn (eager, Inductor, Kiln, eager, ...; each compiled
afresh per round, from the warm caches), and each column is the median of
its N figures: a host-bound step on a shared machine drifts by tens of
percent between one minute and the next, which measuring the backends in
turn spreads over all of them. A private kilnd on an ephemeral
port unless --server is given; "kiln/best" is Kiln's time over the faster
of eager and Inductor (<= 1: Kiln as fast or faster).
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from typing import Dict, List, Tuple

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd, step_ms

import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln


def cases(device: str, cuda: bool) -> List[Tuple[str, nn.Module, Tuple]]:
    """(name, module whose forward returns a scalar loss, its inputs)."""
    g = torch.Generator(device=device).manual_seed(0)
    vocab, dim, tokens = (50257, 768, (8, 1024)) if cuda else (50257, 768, (2, 128))
    nchw = (32, 256, 56, 56) if cuda else (4, 64, 28, 28)
    n_drop = 2 ** 26 if cuda else 2 ** 22

    class EmbeddingCE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)

        def forward(self, ids, targets):
            x = self.emb(ids)
            logits = x @ self.emb.weight.t()
            return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    class CE(nn.Module):
        def forward(self, logits, targets):
            return F.cross_entropy(logits, targets)

    class Norm(nn.Module):
        def __init__(self, norm: nn.Module) -> None:
            super().__init__()
            self.norm = norm

        def forward(self, x):
            return self.norm(x).square().mean()

    class Dropout(nn.Module):
        def forward(self, x):
            return F.dropout(x, p=0.1, training=True).sum()

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(512, 768 if cuda else 64)

        def forward(self, ids):
            return self.emb(ids).square().mean()

    class Cumsum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(514, 768 if cuda else 64)

        def forward(self, ids):
            # RoBERTa's position ids (padding id 1), then their embedding.
            mask = ids.ne(1).int()
            pos = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
            return self.emb(pos).cumsum(1).square().mean()

    pos_ids = torch.randint(0, 512, (8, 512) if cuda else (8, 64),
                            device=device, generator=g)
    tok_ids = torch.randint(0, 5, (8, 512), device=device, generator=g)
    ids = torch.randint(0, vocab, tokens, device=device, generator=g)
    targets = torch.randint(0, vocab, tokens, device=device, generator=g)
    n = tokens[0] * tokens[1]
    logits = torch.randn(n, vocab, device=device, generator=g).requires_grad_()
    x = torch.randn(*nchw, device=device, generator=g).requires_grad_()
    drop = torch.randn(n_drop, device=device, generator=g).requires_grad_()
    return [
        ("embedding+ce", EmbeddingCE().to(device), (ids, targets)),
        ("ce", CE(), (logits, targets.view(-1))),
        ("batch_norm", Norm(nn.BatchNorm2d(nchw[1])).to(device), (x,)),
        ("group_norm", Norm(nn.GroupNorm(32, nchw[1])).to(device), (x,)),
        ("dropout", Dropout(), (drop,)),
        ("positions", Positions().to(device), (pos_ids,)),
        ("cumsum", Cumsum().to(device), (tok_ids,)),
    ]


def measure(module: nn.Module, inputs: Tuple, server: str, cuda: bool,
            recompute: bool) -> Tuple["kiln.dynamo.KilnBackend", Dict[str, float]]:
    """One round: ms per step eagerly, with Inductor and with Kiln (and
    Kiln with recompute=True), each compiled afresh; and Kiln's backend."""
    row: Dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row["eager"] = step_ms(lambda: module(*inputs), cuda)
        torch._dynamo.reset()
        ind = torch.compile(module)
        row["inductor"] = step_ms(lambda: ind(*inputs), cuda)
        torch._dynamo.reset()
        backend = kiln.backend(server=server, fallback="eager")
        kln = torch.compile(module, backend=backend)
        row["kiln"] = step_ms(lambda: kln(*inputs), cuda)
        if recompute:
            torch._dynamo.reset()
            klr = torch.compile(module, backend=kiln.backend(
                server=server, fallback="eager", recompute=True))
            row["recompute"] = step_ms(lambda: klr(*inputs), cuda)
    return backend, row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--server")
    ap.add_argument("--cases", default="", help="comma-separated names")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure the backends in turn this many times; "
                         "each column is the median")
    ap.add_argument("--recompute", action="store_true",
                    help="also Kiln with recompute=True (the backward "
                         "recomputes cheap values instead of reading what "
                         "the forward saved)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    wanted = [c for c in a.cases.split(",") if c]
    daemon = None if a.server else Kilnd()
    server = a.server or daemon.address
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"training ops fwd+bwd, float32, {where}, torch {torch.__version__}; "
          f"ms per step (median of 7 x 10"
          + (f"; median of {a.rounds} rounds)" if a.rounds > 1 else ")"))
    print(f"{'case':<14} {'eager':>9} {'inductor':>9} {'kiln':>9} "
          f"{'kiln/best':>9} {'kiln nodes':>11}"
          + (f" {'recompute':>10}" if a.recompute else ""))
    try:
        for name, module, inputs in cases(a.device, cuda):
            if wanted and name not in wanted:
                continue
            rounds: Dict[str, List[float]] = {}
            for _ in range(max(a.rounds, 1)):
                backend, times = measure(module, inputs, server, cuda,
                                         a.recompute)
                for k, v in times.items():
                    rounds.setdefault(k, []).append(v)
            row = {k: statistics.median(v) for k, v in rounds.items()}
            report = backend.report
            best = min(row["eager"], row["inductor"])
            print(f"{name:<14} {row['eager']:>9.3f} {row['inductor']:>9.3f} "
                  f"{row['kiln']:>9.3f} {row['kiln'] / best:>8.2f}x "
                  f"{report.kiln_nodes:>5}/{report.kiln_nodes + report.fallback_nodes:<5}"
                  + (f" {row['recompute']:>10.3f}" if a.recompute else ""), flush=True)
    finally:
        if daemon:
            daemon.stop()


if __name__ == "__main__":
    main()
