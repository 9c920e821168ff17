"""Small modules written as people write them, through real_models.py's
harness (one training step each, against eager and float64, with the
share of ATen nodes in Kiln and every fallback named): recurrent nets,
upsampling and padding modes, spatial transformers, nn.Transformer,
masked attention, weight norm, 3-D convolutions, metric losses, PointNet,
a top-k mixture of experts, a VAE, activations, losses, cumulative ops,
EmbeddingBag, scatters and gathers, an FFT mixer, grouped convolutions.
No test names these; they are where ops Kiln lacks show up first
(bench/README.md, session 24).

    PY=$(bash deploy/python-env.sh)
    KILN_LIB=build/client/libkiln_c.so KILN_KILND=build/server/kilnd \
      PYTHONPATH=python $PY bench/python/idioms.py [names...] [real_models.py's flags]
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import real_models as rm


class LSTMLM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(50, 16); s.rnn = nn.LSTM(16, 24, num_layers=2, batch_first=True); s.out = nn.Linear(24, 50)
    def forward(s, x):
        h, _ = s.rnn(s.emb(x)); return F.cross_entropy(s.out(h).flatten(0, 1), x.flatten(), label_smoothing=0.1)


class GRUCls(nn.Module):
    def __init__(s):
        super().__init__(); s.rnn = nn.GRU(8, 16, bidirectional=True, batch_first=True); s.fc = nn.Linear(32, 3)
    def forward(s, x):
        h, _ = s.rnn(x); return s.fc(h.mean(1))


class UNetish(nn.Module):
    def __init__(s):
        super().__init__()
        s.d1 = nn.Conv2d(3, 8, 3, padding=1); s.d2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        s.up = nn.ConvTranspose2d(16, 8, 2, stride=2); s.o = nn.Conv2d(16, 2, 1); s.n = nn.InstanceNorm2d(8, affine=True)
    def forward(s, x):
        a = F.leaky_relu(s.n(s.d1(x)), 0.2); b = F.elu(s.d2(a))
        u = s.up(b); c = torch.cat([u, a], 1)
        y = s.o(c)
        return F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)


class StyleNet(nn.Module):
    def __init__(s):
        super().__init__(); s.c1 = nn.Conv2d(3, 8, 3); s.c2 = nn.Conv2d(8, 3, 3)
    def forward(s, x):
        y = F.relu(s.c1(F.pad(x, (1, 1, 1, 1), mode="reflect")))
        y = F.interpolate(y, scale_factor=2, mode="nearest")
        y = s.c2(F.pad(y, (1, 1, 1, 1), mode="replicate"))
        return torch.tanh(y)


class ESPCN(nn.Module):
    def __init__(s):
        super().__init__(); s.c = nn.Conv2d(3, 12, 3, padding=1); s.p = nn.PReLU()
    def forward(s, x):
        return F.pixel_shuffle(s.p(s.c(x)), 2).clamp(0, 1)


class STN(nn.Module):
    def __init__(s):
        super().__init__(); s.loc = nn.Linear(3 * 16 * 16, 6)
        nn.init.zeros_(s.loc.weight); s.loc.bias.data = torch.tensor([1., 0, 0, 0, 1, 0])
    def forward(s, x):
        th = s.loc(x.flatten(1)).view(-1, 2, 3) + 0.1 * torch.eye(2, 3)
        g = F.affine_grid(th, x.shape, align_corners=False)
        return F.grid_sample(x, g, align_corners=False)


class Seq2Seq(nn.Module):
    def __init__(s):
        super().__init__(); s.t = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=64, dropout=0.0, batch_first=True)
    def forward(s, a, b):
        m = nn.Transformer.generate_square_subsequent_mask(b.shape[1])
        return s.t(a, b, tgt_mask=m)


class MHAPad(nn.Module):
    def __init__(s):
        super().__init__(); s.m = nn.MultiheadAttention(32, 4, batch_first=True)
    def forward(s, x):
        pad = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool); pad[:, -3:] = True
        y, w = s.m(x, x, x, key_padding_mask=pad)
        return y, w


class TCNwn(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1 = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 8, 3, dilation=2, padding=4))
        s.c2 = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 4, 3, dilation=1, padding=2))
    def forward(s, x):
        y = F.gelu(s.c1(x)[..., :-4]); return x + s.c2(y)[..., :-2]


class Net3D(nn.Module):
    def __init__(s):
        super().__init__(); s.c = nn.Conv3d(2, 4, 3, padding=1); s.b = nn.BatchNorm3d(4); s.f = nn.Linear(4, 2)
    def forward(s, x):
        y = F.max_pool3d(F.relu6(s.b(s.c(x))), 2)
        return s.f(F.adaptive_avg_pool3d(y, 1).flatten(1))


class Siamese(nn.Module):
    def __init__(s):
        super().__init__(); s.f = nn.Sequential(nn.Linear(10, 16), nn.Hardswish(), nn.Linear(16, 8))
    def forward(s, a, p, n):
        ea, ep, en = (F.normalize(s.f(t), dim=-1) for t in (a, p, n))
        l = F.triplet_margin_loss(ea, ep, en) + (1 - F.cosine_similarity(ea, ep)).mean()
        return l + torch.cdist(ea, en).mean()


class PointNet(nn.Module):
    def __init__(s):
        super().__init__(); s.m = nn.Sequential(nn.Conv1d(3, 16, 1), nn.BatchNorm1d(16), nn.ReLU(), nn.Conv1d(16, 32, 1)); s.h = nn.Linear(32, 4)
    def forward(s, x):
        f = s.m(x)
        g = f.max(dim=2).values
        t = f.topk(3, dim=2).values.mean(-1)
        return s.h(g + t)


class MoE(nn.Module):
    def __init__(s):
        super().__init__(); s.g = nn.Linear(16, 4); s.e = nn.Parameter(torch.randn(4, 16, 16) * 0.1)
    def forward(s, x):
        p = s.g(x).softmax(-1); w, i = p.topk(2, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        ew = s.e[i]  # (T, 2, 16, 16)
        y = torch.einsum("td,tkde->tke", x, ew)
        return (y * w.unsqueeze(-1)).sum(1)


class VAE(nn.Module):
    def __init__(s):
        super().__init__(); s.e = nn.Linear(20, 8); s.d = nn.Linear(4, 20)
    def forward(s, x):
        mu, lv = s.e(x).chunk(2, -1)
        z = mu + torch.exp(0.5 * lv) * torch.ones_like(mu) * 0.3
        r = s.d(z)
        kl = -0.5 * torch.sum(1 + lv - mu.pow(2) - lv.exp())
        return F.binary_cross_entropy_with_logits(r, torch.sigmoid(x), pos_weight=torch.full((20,), 2.0)) + kl


class Acts(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(12, 12)
    def forward(s, x):
        y = s.l(x)
        return (F.mish(y) + F.selu(y) + F.softplus(y, beta=2) + F.silu(y) + F.hardsigmoid(y) + F.logsigmoid(y)
                + F.glu(torch.cat([y, y], -1)) + F.softsign(y) + F.celu(y) + F.hardtanh(y) + torch.erf(y) + torch.atan(y))


class Losses(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(8, 5)
    def forward(s, x, t):
        y = s.l(x)
        return (F.nll_loss(F.log_softmax(y, -1), t) + F.kl_div(F.log_softmax(y, -1), F.softmax(y.detach() * 2, -1), reduction="batchmean")
                + F.smooth_l1_loss(y, y.detach() + 1) + F.huber_loss(y, torch.zeros_like(y)) + F.multi_margin_loss(y, t)
                + F.mse_loss(y.logsumexp(-1), y.amax(-1)) + y.std(0).mean() + y.var(1, unbiased=False).mean())


class Cums(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(8, 8)
    def forward(s, x):
        y = torch.sigmoid(s.l(x))
        return torch.cumprod(y, 1) + torch.logcumsumexp(y, 1) + torch.cummax(y, 1).values + y.flip(1).cumsum(1)


class EmbBag(nn.Module):
    def __init__(s):
        super().__init__(); s.b = nn.EmbeddingBag(30, 8, mode="mean"); s.e = nn.Embedding(30, 8, padding_idx=0); s.f = nn.Linear(8, 2)
    def forward(s, x, off):
        return s.f(s.b(x, off)) + s.f(s.e(x)).sum()


class Gather(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(8, 8)
    def forward(s, x, idx):
        y = s.l(x)
        z = torch.zeros_like(y).scatter_add(1, idx, y) + y.gather(1, idx)
        w = torch.zeros(8, 8).index_add(0, idx[:, 0], y)
        m = y.masked_fill(y > 0.5, -1.0)
        return z.sum() + w.sum() + torch.where(m < 0, m * 2, m).sum() + F.one_hot(y.argmax(-1), 8).float().mul(y).sum()


class FNetish(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(8, 8); s.n = nn.LayerNorm(8)
    def forward(s, x):
        y = torch.fft.fft2(s.l(x).to(torch.complex64)).real
        return s.n(y + x)


class GroupedConv(nn.Module):
    def __init__(s):
        super().__init__(); s.dw = nn.Conv2d(8, 8, 5, padding=2, groups=8); s.pw = nn.Conv2d(8, 16, 1); s.gn = nn.GroupNorm(4, 16); s.ln = nn.LocalResponseNorm(3)
    def forward(s, x):
        y = s.gn(s.pw(s.dw(x)))
        y = F.avg_pool2d(y, 3, stride=2, padding=1, count_include_pad=False) + F.adaptive_max_pool2d(y, (4, 4)).repeat_interleave(2, -1).repeat_interleave(2, -2)[..., :y.shape[-2] // 2 + y.shape[-2] % 2, :y.shape[-1] // 2 + y.shape[-1] % 2]
        return s.ln(y)


def ex(m, *inputs):
    return lambda: (m(), inputs)


g = torch.Generator().manual_seed(1)
R = lambda *s: torch.randn(*s, generator=g)
IDIOMS = {
    "lstm_lm": ex(LSTMLM, torch.randint(0, 50, (2, 7), generator=g)),
    "gru_cls": ex(GRUCls, R(3, 5, 8)),
    "unetish": ex(UNetish, R(2, 3, 16, 16)),
    "stylenet": ex(StyleNet, R(2, 3, 12, 12)),
    "espcn": ex(ESPCN, R(2, 3, 10, 10)),
    "stn": ex(STN, R(2, 3, 16, 16)),
    "seq2seq": ex(Seq2Seq, R(2, 6, 32), R(2, 5, 32)),
    "mha_pad": ex(MHAPad, R(2, 7, 32)),
    "tcn_wn": ex(TCNwn, R(2, 4, 20)),
    "net3d": ex(Net3D, R(2, 2, 6, 6, 6)),
    "siamese": ex(Siamese, R(4, 10), R(4, 10), R(4, 10)),
    "pointnet": ex(PointNet, R(3, 3, 20)),
    "moe": ex(MoE, R(6, 16)),
    "vae": ex(VAE, R(4, 20)),
    "acts": ex(Acts, R(5, 12)),
    "losses": ex(Losses, R(6, 8), torch.randint(0, 5, (6,), generator=g)),
    "cums": ex(Cums, R(3, 8)),
    "embbag": ex(EmbBag, torch.randint(0, 30, (10,), generator=g), torch.tensor([0, 3, 7])),
    "gather": ex(Gather, R(8, 8), torch.randint(0, 8, (8, 8), generator=g)),
    "fnet": ex(FNetish, R(2, 4, 8)),
    "grouped": ex(GroupedConv, R(2, 8, 11, 11)),
}
# -- second batch (session 25): what training code does beyond the layers --


class ComplexRoPE(nn.Module):
    """Meta's Llama rotary embedding: complex multiplication
    (view_as_complex / polar), then attention with a float mask."""
    def __init__(s):
        super().__init__(); s.q = nn.Linear(32, 32); s.k = nn.Linear(32, 32); s.v = nn.Linear(32, 32)
        f = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
        s.register_buffer("cis", torch.polar(torch.ones(6, 4), torch.outer(torch.arange(6).float(), f)))
    def rope(s, x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * s.cis[None, :, None]).flatten(3).type_as(x)
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = (m(x).view(b, t, 4, 8) for m in (s.q, s.k, s.v))
        q, k = s.rope(q), s.rope(k)
        mask = torch.full((t, t), float("-inf"), device=x.device).triu(1)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)


class AlibiAttn(nn.Module):
    """ALiBi: a per-head linear bias added to the scores, boolean padding
    mask, masked_fill with -inf, softmax, nan_to_num for empty rows."""
    def __init__(s):
        super().__init__(); s.qkv = nn.Linear(16, 48); s.o = nn.Linear(16, 16)
        s.register_buffer("slopes", torch.tensor([0.5, 0.25, 0.125, 0.0625]))
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(x).view(b, t, 3, 4, 4).permute(2, 0, 3, 1, 4)
        pos = torch.arange(t)
        bias = -(pos[None, :] - pos[:, None]).abs().float() * s.slopes[:, None, None]
        sc = q @ k.transpose(-1, -2) / 2.0 + bias
        pad = torch.zeros(b, t, dtype=torch.bool); pad[0, -2:] = True
        sc = sc.masked_fill(pad[:, None, None, :], float("-inf"))
        p = torch.nan_to_num(sc.softmax(-1))
        return s.o((p @ v).transpose(1, 2).reshape(b, t, 16))


class T5Bias(nn.Module):
    """T5's relative position buckets: log, clamp, where, an embedding."""
    def __init__(s):
        super().__init__(); s.e = nn.Embedding(8, 2); s.l = nn.Linear(6, 6)
    def forward(s, x):
        t = x.shape[1]
        rel = torch.arange(t)[None, :] - torch.arange(t)[:, None]
        n = -rel.clamp(max=0)
        large = 4 + (torch.log(n.float().clamp(min=1) / 4) / 1.0 * 4).long()
        bucket = torch.where(n < 4, n, large.clamp(max=7))
        bias = s.e(bucket).permute(2, 0, 1)
        return (s.l(x)[:, None] + bias[None, :, :, :t]).sum()


class AudioCTC(nn.Module):
    """A speech model's tail: 1-D convolutions, GLU, log_softmax and CTC."""
    def __init__(s):
        super().__init__(); s.c = nn.Conv1d(8, 32, 5, padding=2); s.d = nn.Conv1d(16, 16, 3, padding=1, groups=16); s.o = nn.Linear(16, 6)
    def forward(s, x, tgt):
        y = F.glu(s.c(x), dim=1); y = F.silu(s.d(y))
        lp = s.o(y.transpose(1, 2)).log_softmax(-1).transpose(0, 1)
        il = torch.full((x.shape[0],), x.shape[2], dtype=torch.long)
        tl = torch.full((x.shape[0],), tgt.shape[1], dtype=torch.long)
        return F.ctc_loss(lp, tgt, il, tl)


class StraightThroughVQ(nn.Module):
    """Hard one-hot codes with a straight-through gradient (one_hot of the
    argmax), a reparameterized Normal (fixed noise: the harness compares
    with eager) and torch.distributions' KL."""
    def __init__(s):
        super().__init__(); s.enc = nn.Linear(12, 16); s.cb = nn.Embedding(16, 12); s.mu = nn.Linear(12, 4); s.lv = nn.Linear(12, 4)
        s.register_buffer("eps", torch.randn(5, 4, generator=torch.Generator().manual_seed(3)))
    def forward(s, x):
        soft = (s.enc(x) / 0.5).softmax(-1)
        hard = F.one_hot(soft.argmax(-1), 16).to(soft.dtype)
        z = (hard - soft.detach() + soft) @ s.cb.weight
        mu, lv = s.mu(z), s.lv(z)
        d = torch.distributions.Normal(mu, (0.5 * lv).exp())
        smp = mu + d.stddev * s.eps
        kl = torch.distributions.kl_divergence(d, torch.distributions.Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum(-1)
        return (smp.square().sum(-1) + kl + d.log_prob(smp).sum(-1)).mean()


class SortOps(nn.Module):
    """sort/argsort, kthvalue, median, logsumexp, cummax, diff, searchsorted
    and bucketize, as ranking and quantile losses use them."""
    def __init__(s):
        super().__init__(); s.l = nn.Linear(10, 10); s.register_buffer("edges", torch.linspace(-2, 2, 5))
    def forward(s, x):
        y = s.l(x)
        v, i = y.sort(-1, descending=True)
        r = torch.gather(y, -1, i.argsort(-1))
        k = y.kthvalue(3, -1).values + y.median(-1).values
        cm = y.cummax(-1).values
        b = torch.bucketize(y.detach(), s.edges).float() + torch.searchsorted(s.edges, y.detach().contiguous()).float()
        return (v[:, :3].sum() + r.mean() + k.mean() + torch.logsumexp(y, -1).mean()
                + cm.diff(dim=-1).mean() + (b * y).mean())


class UnfoldPatch(nn.Module):
    """Unfold/Fold (patch extraction as in ViT-from-scratch code),
    PixelUnshuffle, nn.Bilinear, Dropout2d, instance norm."""
    def __init__(s):
        super().__init__(); s.bl = nn.Bilinear(12, 12, 4); s.n = nn.InstanceNorm2d(12); s.dr = nn.Dropout2d(0.2)
    def forward(s, x):
        p = F.unfold(x, kernel_size=2, stride=2).transpose(1, 2)
        y = s.bl(p, p.flip(1))
        z = F.fold(p.transpose(1, 2), x.shape[-2:], kernel_size=2, stride=2)
        u = s.n(s.dr(F.pixel_unshuffle(z, 2)))
        return y.mean() + u.square().mean()


class EmaStep(nn.Module):
    """An EMA update of a shadow copy inside the compiled step (in-place
    lerp_ under no_grad), then addcmul/addcdiv/lerp in the loss."""
    def __init__(s):
        super().__init__(); s.l = nn.Linear(8, 8); s.register_buffer("shadow", torch.zeros(8, 8))
    def forward(s, x):
        with torch.no_grad():
            s.shadow.lerp_(s.l.weight, 0.1)
        y = s.l(x)
        return (torch.addcmul(y, y, x, value=0.5) + torch.addcdiv(x, y, x.abs() + 1) + torch.lerp(y, x, 0.3)).square().mean() + (s.shadow * s.l.weight).sum()


class Interp(nn.Module):
    """Bicubic and antialiased resizing, area pooling, bicubic grid_sample,
    ConvTranspose3d, replicate padding in 3-D."""
    def __init__(s):
        super().__init__(); s.c = nn.Conv2d(3, 4, 3, padding=1); s.t = nn.ConvTranspose3d(1, 2, 2, stride=2)
    def forward(s, x):
        y = s.c(x)
        a = F.interpolate(y, size=(7, 9), mode="bicubic", align_corners=False)
        b = F.interpolate(y, size=(5, 5), mode="bilinear", antialias=True)
        c = F.interpolate(y, size=(4, 4), mode="area")
        g = torch.stack(torch.meshgrid(torch.linspace(-1, 1, 6), torch.linspace(-1, 1, 6), indexing="xy"), -1)[None].expand(x.shape[0], -1, -1, -1)
        d = F.grid_sample(y, g, mode="bicubic", align_corners=True)
        e = s.t(F.pad(y[:, :1, None], (1, 1, 1, 1, 1, 1), mode="replicate"))
        return a.mean() + b.square().mean() + c.sum() + d.mean() + e.mean()


class FocalKL(nn.Module):
    """Focal loss, KL divergence with log targets, poisson NLL, Huber,
    multilabel soft margin, margin ranking, cosine embedding losses."""
    def __init__(s):
        super().__init__(); s.l = nn.Linear(6, 5)
    def forward(s, x, y):
        z = s.l(x); lp = z.log_softmax(-1)
        pt = lp.gather(1, y[:, None]).squeeze(1).exp()
        focal = (-(1 - pt) ** 2 * pt.log()).mean()
        kl = F.kl_div(lp, torch.full_like(lp, -1.6094), reduction="batchmean", log_target=True)
        t = torch.ones(x.shape[0]); t[::2] = -1
        return (focal + kl + F.poisson_nll_loss(z.exp(), z.detach().abs()) + F.huber_loss(z, z.detach() * 0.5, delta=0.3)
                + F.multilabel_soft_margin_loss(z, (z.detach() > 0).float()) + F.margin_ranking_loss(z[:, 0], z[:, 1], t)
                + F.cosine_embedding_loss(z, z.flip(0), t))


class EmbMaxNorm(nn.Module):
    """Embedding with padding_idx and max_norm (which renormalizes rows of
    the weight in place), scale_grad_by_freq, and output logits through
    the embedding's own weight (tied)."""
    def __init__(s):
        super().__init__(); s.e = nn.Embedding(20, 8, padding_idx=0, max_norm=1.0); s.f = nn.Embedding(20, 8, scale_grad_by_freq=True)
    def forward(s, i):
        h = s.e(i) + s.f(i)
        return F.cross_entropy((h @ s.f.weight.t()).flatten(0, 1), i.flatten(), ignore_index=0)


IDIOMS.update({
    "complex_rope": ex(ComplexRoPE, R(2, 6, 32)),
    "alibi": ex(AlibiAttn, R(2, 6, 16)),
    "t5_bias": ex(T5Bias, R(2, 6, 6)),
    "audio_ctc": ex(AudioCTC, R(2, 8, 12), torch.randint(1, 6, (2, 4), generator=g)),
    "st_vq": ex(StraightThroughVQ, R(5, 12)),
    "sort_ops": ex(SortOps, R(4, 10)),
    "unfold": ex(UnfoldPatch, R(2, 3, 8, 8)),
    "ema": ex(EmaStep, R(4, 8)),
    "interp": ex(Interp, R(2, 3, 8, 8)),
    "focal_kl": ex(FocalKL, R(6, 6), torch.randint(0, 5, (6,), generator=g)),
    "emb_maxnorm": ex(EmbMaxNorm, torch.randint(0, 20, (3, 5), generator=g)),
})


if __name__ == "__main__":
    rm.MODELS.clear()
    rm.MODELS.update(IDIOMS)
    rm.main()
