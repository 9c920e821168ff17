"""Models the test suite does not name, for the coverage report
(bench/python/coverage.py): common architectures written with torch.nn as
people write them, small enough to trace on a 2-core machine. Each
function returns (model, inputs); coverage.py's loss is the sum of the
floating outputs.

    PY=$(bash deploy/python-env.sh)
    cd bench/python && $PY coverage.py --no-suite $(python3 -c \
        "import zoo; print(' '.join('zoo:' + n for n in zoo.ALL))")

None of these shapes or modules appears in tests/; they exist to tell how
much of models in general runs in Kiln.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

Example = Tuple[nn.Module, Tuple[Any, ...]]


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _ViT(nn.Module):
    """ViT-tiny style: patch embedding conv, class token, position
    embedding, pre-norm nn.MultiheadAttention blocks, GELU MLP, head."""

    def __init__(self, dim: int = 64, depth: int = 2, heads: int = 4,
                 patch: int = 4, image: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict({
                "n1": nn.LayerNorm(dim),
                "attn": nn.MultiheadAttention(dim, heads, batch_first=True),
                "n2": nn.LayerNorm(dim),
                "mlp": nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                     nn.Linear(4 * dim, dim)),
            }))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for b in self.blocks:
            h = b["n1"](x)
            x = x + b["attn"](h, h, h, need_weights=False)[0]
            x = x + b["mlp"](b["n2"](x))
        return self.head(self.norm(x)[:, 0])


def vit() -> Example:
    torch.manual_seed(0)
    return _ViT(), (torch.randn(2, 3, 16, 16, generator=_g()),)


class _Bert(nn.Module):
    """BERT style: token + position + segment embeddings, LayerNorm,
    dropout, post-norm nn.TransformerEncoder with a padding mask, a tanh
    pooler and a cross-entropy classification loss."""

    def __init__(self, vocab: int = 500, dim: int = 64, layers: int = 2,
                 heads: int = 4, seq: int = 32, classes: int = 3) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.seg = nn.Embedding(2, dim)
        self.norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1,
                                           activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers,
                                             enable_nested_tensor=False)
        self.pool = nn.Linear(dim, dim)
        self.cls = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor,
                pad: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.norm(self.tok(ids) + self.pos(pos) + self.seg(segments)))
        x = self.encoder(x, src_key_padding_mask=pad)
        logits = self.cls(torch.tanh(self.pool(x[:, 0])))
        return F.cross_entropy(logits, labels)


def bert() -> Example:
    torch.manual_seed(0)
    g = _g()
    ids = torch.randint(0, 500, (2, 32), generator=g)
    segments = torch.randint(0, 2, (2, 32), generator=g)
    pad = torch.zeros(2, 32, dtype=torch.bool)
    pad[1, 24:] = True
    labels = torch.randint(0, 3, (2,), generator=g)
    return _Bert(), (ids, segments, pad, labels)


class _Mixer(nn.Module):
    """MLP-Mixer: token-mixing and channel-mixing MLPs over transposes."""

    def __init__(self, tokens: int = 16, dim: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 4, stride=4)
        self.layers = nn.ModuleList()
        for _ in range(depth):
            self.layers.append(nn.ModuleList([
                nn.LayerNorm(dim),
                nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                              nn.Linear(2 * tokens, tokens)),
                nn.LayerNorm(dim),
                nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                              nn.Linear(4 * dim, dim)),
            ]))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        for n1, tok, n2, ch in self.layers:
            x = x + tok(n1(x).transpose(1, 2)).transpose(1, 2)
            x = x + ch(n2(x))
        return self.head(x.mean(dim=1))


def mixer() -> Example:
    torch.manual_seed(0)
    return _Mixer(), (torch.randn(2, 3, 16, 16, generator=_g()),)


class _MobileNetBlock(nn.Module):
    """MobileNetV2 inverted residual blocks: 1x1 expand, depthwise 3x3,
    ReLU6, BatchNorm, 1x1 project, global pooling, dropout, classifier."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False),
                                  nn.BatchNorm2d(c), nn.ReLU6())

        def block(cin: int, cout: int, stride: int) -> nn.Module:
            h = cin * 4
            return nn.Sequential(
                nn.Conv2d(cin, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False),
                nn.BatchNorm2d(h), nn.ReLU6(),
                nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout))

        self.b1 = block(c, c, 1)
        self.b2 = block(c, 2 * c, 2)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(2 * c, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.b1(x)
        x = self.b2(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def mobilenet() -> Example:
    torch.manual_seed(0)
    return _MobileNetBlock(), (torch.randn(2, 3, 32, 32, generator=_g()),)


class _UNet(nn.Module):
    """A two-level U-Net: conv + GroupNorm + SiLU, max pooling down,
    transposed convolution up, skip concatenation."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()

        def conv(cin: int, cout: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1),
                                 nn.GroupNorm(4, cout), nn.SiLU())

        self.down = conv(3, c)
        self.mid = conv(c, 2 * c)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.out = nn.Sequential(conv(2 * c, c), nn.Conv2d(c, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.down(x)
        m = self.mid(F.max_pool2d(d, 2))
        return torch.sigmoid(self.out(torch.cat([self.up(m), d], dim=1)))


def unet() -> Example:
    torch.manual_seed(0)
    return _UNet(), (torch.randn(2, 3, 16, 16, generator=_g()),)


class _GPT2(nn.Module):
    """GPT-2 style decoder, written with F.scaled_dot_product_attention
    (causal), tied embeddings, learned positions, and the shifted
    cross-entropy loss."""

    def __init__(self, vocab: int = 300, dim: int = 64, heads: int = 4,
                 layers: int = 2, seq: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([nn.ModuleDict({
            "ln1": nn.LayerNorm(dim), "qkv": nn.Linear(dim, 3 * dim),
            "proj": nn.Linear(dim, dim), "ln2": nn.LayerNorm(dim),
            "fc": nn.Linear(dim, 4 * dim), "out": nn.Linear(4 * dim, dim),
        }) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                       for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh"))
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               ids[:, 1:].reshape(-1))


def gpt2() -> Example:
    torch.manual_seed(0)
    return _GPT2(), (torch.randint(0, 300, (2, 32), generator=_g()),)


class _Autoencoder(nn.Module):
    """A VAE: MLP encoder to mean and log-variance, reparameterisation with
    randn_like, decoder with sigmoid, BCE + KL loss."""

    def __init__(self, d: int = 64, z: int = 8) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 32), nn.LeakyReLU(0.1))
        self.mu = nn.Linear(32, z)
        self.logvar = nn.Linear(32, z)
        self.dec = nn.Sequential(nn.Linear(z, 32), nn.Tanh(), nn.Linear(32, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        zs = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        recon = torch.sigmoid(self.dec(zs))
        bce = F.binary_cross_entropy(recon, x, reduction="sum")
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return bce + kl


def vae() -> Example:
    torch.manual_seed(0)
    return _Autoencoder(), (torch.rand(8, 64, generator=_g()),)


class _Llama(nn.Module):
    """A Llama-style decoder layer: RMSNorm, rotary embeddings (cos/sin
    tables, rotate_half), grouped-query attention through SDPA, SwiGLU."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2,
                 seq: int = 32, vocab: int = 200) -> None:
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, dim // heads
        self.emb = nn.Embedding(vocab, dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, 3 * dim, bias=False)
        self.w3 = nn.Linear(dim, 3 * dim, bias=False)
        self.w2 = nn.Linear(3 * dim, dim, bias=False)
        self.n1 = nn.Parameter(torch.ones(dim))
        self.n2 = nn.Parameter(torch.ones(dim))
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        freqs = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.out = nn.Linear(dim, vocab, bias=False)

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def _rope(self, x: torch.Tensor, t: int) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        rot = torch.cat([-x2, x1], dim=-1)
        return x * self.cos[:t] + rot * self.sin[:t]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        x = self.emb(ids)
        h = self._rms(x, self.n1)
        q = self.wq(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = self._rope(q, t), self._rope(k, t)
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        h = self._rms(x, self.n2)
        x = x + self.w2(F.silu(self.w1(h)) * self.w3(h))
        logits = self.out(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1))


def llama() -> Example:
    torch.manual_seed(0)
    return _Llama(), (torch.randint(0, 200, (2, 32), generator=_g()),)


class _ConvLSTMish(nn.Module):
    """A 1-D temporal ConvNet for sequences (TCN style): causal padded
    Conv1d with dilation, weight-normed-free residual blocks, LayerNorm over
    channels via permutes, a softplus head and an MSE loss."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.inp = nn.Conv1d(4, c, 1)
        self.convs = nn.ModuleList([nn.Conv1d(c, c, 3, dilation=d) for d in (1, 2, 4)])
        self.norms = nn.ModuleList([nn.LayerNorm(c) for _ in range(3)])
        self.head = nn.Linear(c, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for conv, norm in zip(self.convs, self.norms):
            pad = (conv.dilation[0] * 2, 0)
            z = F.relu(conv(F.pad(h, pad)))
            h = h + norm(z.transpose(1, 2)).transpose(1, 2)
        out = F.softplus(self.head(h.transpose(1, 2))).squeeze(-1)
        return F.mse_loss(out, y)


def tcn() -> Example:
    torch.manual_seed(0)
    g = _g()
    return _ConvLSTMish(), (torch.randn(2, 4, 40, generator=g),
                            torch.rand(2, 40, generator=g))


ALL = ["vit", "bert", "mixer", "mobilenet", "unet", "gpt2", "vae", "llama", "tcn"]
