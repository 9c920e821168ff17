"""Models from the libraries people train with — torchvision, Hugging Face
transformers, timm — through torch.compile(backend=kiln) for one training
step each (forward, a loss over every floating output, backward), checked
against eager and against a float64 eager run, with the share of ATen nodes
that ran in Kiln. No test names these models: this is how Kiln fares on
code it was not written against.

    PY=$(bash deploy/python-env.sh)
    bash bench/python/real_models_env.sh          # the libraries, once
    $PY bench/python/real_models.py [--dynamic] [--device cuda] [names...]
    $PY bench/python/real_models.py --device cuda --amp bfloat16 \\
        --time 20 --scale 8 --seq 128 --image 128 [names...]   # step times
    $PY bench/python/real_models.py timm:resnet50 hf:Qwen3ForCausalLM  # any

A name may also be timm:NAME (any timm architecture) or hf:CLASS (any
transformers text model, its configuration shrunk to 2 layers of 64 wide;
_HF_ANY_SMALL). A model whose eager step raises at these sizes is SKIPPED.

Per model: nodes in Kiln / all (and the share without views left at a
partition's edge, which run eagerly for free; since partitions return the
views of their inputs themselves, fx_graph.ViewOutput, there are none next
to ops Kiln runs), partitions, and the worst parameter (or output) by the
ratio of Kiln's error to eager's, both against float64 (the
error that says whether Kiln is worse than eager float32 itself). A model
is MISMATCH when some result's error against float64 (relative to its
largest magnitude, or to 1e-5 of the step's largest result where that is
larger: a gradient that is zero in exact arithmetic is rounding either
way) is above 1e-4 and 20x eager's, unless eager itself moves as far when its parameters and inputs
are nudged by a few float32 ulps (2^-20 relative): then the step is
SENSITIVE at these sizes (a ReLU mask element within rounding of zero
flips and moves a gradient by a whole element's share; rounding that is
merely different, as reassociated sums are, does the same), which is not
counted as a failure. ERROR when the compiled step raised. FALLBACK when
the results are right but Kiln warned that something it compiled runs
eagerly (a partition kilnd refused, or one whose call failed: a guard or
the runtime), whose warnings the line then lists. Dropout, stochastic depth and
attention dropout are off (their draws differ from eager's by design);
--dropout keeps them as the models' configurations have them (training
as people run it: Kiln's and eager's draws differ, so the step is only
checked for finite results and every gradient eager gives, and the node
counts, partitions and step times are the figures). --checkpointing turns
on the Hugging Face models' gradient checkpointing (non-reentrant
torch.utils.checkpoint around each layer: Dynamo's
tag_activation_checkpoint subgraphs) for every run, eager and float64
included; other models are SKIPPED.
Inputs are small (2 images of 64x64, 2 sequences of 16 tokens) and the
transformers small configurations, so a CPU run takes minutes. The
libraries come from real_models_env.sh's directory (~/.cache/kiln/
real-models; KILN_REAL_MODELS_DIR overrides it); a model whose library is
missing is skipped. A private kilnd on an ephemeral port serves unless --server.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import sys
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd, ms_per_call

_LIBS = os.environ.get("KILN_REAL_MODELS_DIR", os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
    "kiln", "real-models"))
if os.path.isdir(_LIBS) and _LIBS not in sys.path:
    sys.path.append(_LIBS)  # after the venv: its torch and numpy win

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import kiln  # noqa: E402
import kiln.dynamo  # noqa: E402 (_drop_client, for --warm)

Example = Tuple[nn.Module, Tuple[Any, ...]]

# Input sizes (main's --scale, --seq, --image): batches are multiplied by
# SCALE, token sequences are SEQ long, torchvision/timm images IMAGE wide.
SCALE, SEQ, IMAGE = 1, 16, 64
# main's --dropout: the models keep their dropout (see the docstring).
KEEP_DROPOUT = False
# main's --checkpointing (see the docstring).
CHECKPOINTING = False
# --cudagraphs: Kiln with cudagraphs=True, Inductor's baseline with
# mode="reduce-overhead" (both CUDA graph trees).
CUDAGRAPHS = False
# --warm: a second first step per model, as a restarted process finds it.
WARM = False


def _b(batch: int) -> int:
    return batch * SCALE


def _tv(name: str, batch: int = 2, min_image: int = 0,
        **kw: Any) -> Callable[[], Example]:
    """A torchvision classifier on images of IMAGE (at least min_image);
    an `image_size` keyword is set to that size."""
    def make() -> Example:
        import torchvision.models as m  # noqa: PLC0415
        side = max(IMAGE, min_image)
        args = dict(kw, image_size=side) if "image_size" in kw else kw
        return getattr(m, name)(**args), (torch.randn(_b(batch), 3, side,
                                                      side),)
    return make


def _tv_vit() -> Example:
    from torchvision.models.vision_transformer import VisionTransformer  # noqa: PLC0415
    return (VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                              num_heads=4, hidden_dim=64, mlp_dim=128,
                              num_classes=10), (torch.randn(_b(2), 3, 32, 32),))


def _tv_vit_ti() -> Example:
    """ViT-Ti/16's layer geometry (hidden 192, 3 heads of 64, MLP 768), 4
    layers, on images of IMAGE rounded to the patch (nn.MultiheadAttention
    at (IMAGE / 16)^2 + 1 tokens)."""
    from torchvision.models.vision_transformer import VisionTransformer  # noqa: PLC0415
    side = max(16, IMAGE // 16 * 16)
    return (VisionTransformer(image_size=side, patch_size=16, num_layers=4,
                              num_heads=3, hidden_dim=192, mlp_dim=768,
                              num_classes=10),
            (torch.randn(_b(2), 3, side, side),))


class _Logits(nn.Module):
    """A transformers model returning its logits (or first output), its
    positional arguments passed as the keywords `names` when given."""

    def __init__(self, model: nn.Module, names: Tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *args: Any) -> Any:
        out = (self.model(**dict(zip(self.names, args))) if self.names
               else self.model(*args))
        for key in ("logits", "out"):  # transformers; torchvision's
            if key in out:                # segmentation models' dict
                return out[key]
        return out[0]


def _no_dropout(config: Any) -> Any:
    if KEEP_DROPOUT:
        return config
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key
                                         or key.endswith("_prob")):
            setattr(config, key, 0.0)
    return config


def _hf(model_cls: str, config_cls: str, images: bool = False,
        **config: Any) -> Callable[[], Example]:
    def make() -> Example:
        import transformers  # noqa: PLC0415
        cfg = _no_dropout(getattr(transformers, config_cls)(**config))
        model = getattr(transformers, model_cls)(cfg)
        x = (torch.randn(_b(2), 3, 32, 32) if images
             else torch.randint(0, 100, (_b(2), SEQ)))
        return _Logits(model), (x,)
    return make


def _hf_t5() -> Example:
    import transformers  # noqa: PLC0415
    cfg = _no_dropout(transformers.T5Config(
        vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2,
        num_heads=4, decoder_start_token_id=0))
    return (_Logits(transformers.T5ForConditionalGeneration(cfg),
                    ("input_ids", "decoder_input_ids")),
            (torch.randint(0, 100, (_b(2), 12)),
             torch.randint(0, 100, (_b(2), 8))))


def _hf_whisper() -> Example:
    import transformers  # noqa: PLC0415
    cfg = _no_dropout(transformers.WhisperConfig(
        vocab_size=100, num_mel_bins=16, d_model=64, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
        max_target_positions=32, decoder_start_token_id=0, pad_token_id=0))
    return (_Logits(transformers.WhisperForConditionalGeneration(cfg),
                    ("input_features", "decoder_input_ids")),
            (torch.randn(_b(2), 16, 64), torch.randint(0, 100, (_b(2), 8))))


def _timm(name: str, **kw: Any) -> Callable[[], Example]:
    def make() -> Example:
        import timm  # noqa: PLC0415
        if "img_size" in kw:
            kw["img_size"] = IMAGE
        return (timm.create_model(name, pretrained=False, **kw),
                (torch.randn(_b(2), 3, IMAGE, IMAGE),))
    return make


def _timm_any(name: str) -> Callable[[], Example]:
    """Any timm architecture by name (`timm:NAME` on the command line): at
    IMAGE's size where the model takes an img_size, else at its own."""
    def make() -> Example:
        import timm  # noqa: PLC0415
        try:
            model = timm.create_model(name, pretrained=False, img_size=IMAGE)
        except TypeError:  # a model without img_size (most CNNs)
            model = timm.create_model(name, pretrained=False)
        return model, (torch.randn(_b(2), 3, IMAGE, IMAGE),)
    return make


# `hf:CLASS`: every one of these that the class's configuration has is set
# (a small model whose token ids are below 100).
_HF_ANY_SMALL = dict(
    vocab_size=100, hidden_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
    d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4,
    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
    n_embd=64, n_layer=2, n_head=4, n_positions=64,
    max_position_embeddings=64, embedding_size=64, head_dim=16,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    decoder_start_token_id=0, sep_token_id=2, cls_token_id=1,
    # DeepSeek's multi-head latent attention and experts, consistent with
    # the sizes above.
    q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    first_k_dense_replace=1)


def _hf_any(model_cls: str) -> Callable[[], Example]:
    """Any transformers text model by class name (`hf:CLASS` on the
    command line): its configuration class with the sizes of
    _HF_ANY_SMALL it has, token ids as inputs (and decoder ids for an
    encoder-decoder)."""
    def make() -> Example:
        import transformers  # noqa: PLC0415
        cls = getattr(transformers, model_cls)
        default = cls.config_class()
        kw = {k: v for k, v in _HF_ANY_SMALL.items() if hasattr(default, k)}
        if "kv_lora_rank" in kw:  # latent attention: a head per query head,
            kw["num_key_value_heads"] = kw["num_attention_heads"]
            kw.pop("head_dim", None)  # the rotary part's own size
        cfg = _no_dropout(cls.config_class(**kw))
        ids = torch.randint(3, 100, (_b(2), SEQ))
        if getattr(cfg, "is_encoder_decoder", False):
            return (_Logits(cls(cfg), ("input_ids", "decoder_input_ids")),
                    (ids, torch.randint(3, 100, (_b(2), max(SEQ // 2, 1)))))
        return _Logits(cls(cfg)), (ids,)
    return make


def _model(name: str) -> Example:
    """The named model and its inputs: one of MODELS, `timm:NAME` or
    `hf:CLASS`."""
    if name.startswith("timm:"):
        return _timm_any(name[len("timm:"):])()
    if name.startswith("hf:"):
        return _hf_any(name[len("hf:"):])()
    return MODELS[name]()


def _tv_segmentation(name: str) -> Callable[[], Example]:
    def make() -> Example:
        import torchvision.models.segmentation as m  # noqa: PLC0415
        return (_Logits(getattr(m, name)(weights=None,
                                         weights_backbone=None,
                                         num_classes=4)),
                (torch.randn(_b(2), 3, IMAGE, IMAGE),))
    return make


def _tv_video(name: str, frames: int = 4,
              min_side: int = 16) -> Callable[[], Example]:
    """A torchvision video model on clips of `frames` frames of IMAGE / 2
    (at least min_side)."""
    def make() -> Example:
        import torchvision.models.video as m  # noqa: PLC0415
        side = max(IMAGE // 2, min_side)
        return getattr(m, name)(), (torch.randn(_b(1), 3, frames, side,
                                                side),)
    return make


def _hf_wav2vec2() -> Example:
    import transformers  # noqa: PLC0415
    cfg = _no_dropout(transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        mask_time_prob=0.0, layerdrop=0.0))
    return (_Logits(transformers.Wav2Vec2ForCTC(cfg)),
            (torch.randn(_b(2), 1600),))


_SMALL = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, intermediate_size=128)
_DECODER = dict(_SMALL, num_key_value_heads=2)

MODELS: Dict[str, Callable[[], Example]] = {
    "tv_resnet18": _tv("resnet18"),
    "tv_mobilenet_v3_small": _tv("mobilenet_v3_small"),
    "tv_efficientnet_b0": _tv("efficientnet_b0"),
    "tv_convnext_tiny": _tv("convnext_tiny"),
    "tv_shufflenet_v2": _tv("shufflenet_v2_x0_5"),
    "tv_squeezenet": _tv("squeezenet1_1"),
    "tv_densenet121": _tv("densenet121"),
    "tv_regnet_y_400mf": _tv("regnet_y_400mf"),
    "tv_swin_t": _tv("swin_t", batch=1),
    "tv_vit": _tv_vit,
    "tv_vit_ti": _tv_vit_ti,
    "tv_mnasnet": _tv("mnasnet0_5"),
    "tv_googlenet": _tv("googlenet", aux_logits=False, init_weights=True),
    "hf_bert": _hf("BertForMaskedLM", "BertConfig", **_SMALL),
    "hf_gpt2": _hf("GPT2LMHeadModel", "GPT2Config", vocab_size=100, n_embd=64,
                   n_layer=2, n_head=4),
    "hf_llama": _hf("LlamaForCausalLM", "LlamaConfig", **_DECODER),
    "hf_mistral": _hf("MistralForCausalLM", "MistralConfig", **_DECODER),
    "hf_qwen2": _hf("Qwen2ForCausalLM", "Qwen2Config", **_DECODER),
    "hf_distilbert": _hf("DistilBertForSequenceClassification",
                         "DistilBertConfig", vocab_size=100, dim=64,
                         n_layers=2, n_heads=4, hidden_dim=128),
    "hf_roberta": _hf("RobertaForSequenceClassification", "RobertaConfig",
                      **_SMALL),
    "hf_vit": _hf("ViTForImageClassification", "ViTConfig", images=True,
                  image_size=32, patch_size=8, **_SMALL),
    "hf_t5": _hf_t5,
    "hf_bart": _hf("BartForConditionalGeneration", "BartConfig",
                   vocab_size=100, d_model=64, encoder_layers=1,
                   decoder_layers=1, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=128,
                   decoder_ffn_dim=128),
    "hf_albert": _hf("AlbertForMaskedLM", "AlbertConfig", embedding_size=32,
                     **_SMALL),
    "hf_electra": _hf("ElectraForPreTraining", "ElectraConfig",
                      embedding_size=32, **_SMALL),
    "hf_deberta_v2": _hf("DebertaV2ForMaskedLM", "DebertaV2Config", **_SMALL),
    "hf_opt": _hf("OPTForCausalLM", "OPTConfig", vocab_size=100,
                  hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  ffn_dim=128, word_embed_proj_dim=64),
    "hf_gpt_neox": _hf("GPTNeoXForCausalLM", "GPTNeoXConfig", **_SMALL),
    "hf_phi": _hf("PhiForCausalLM", "PhiConfig", **_SMALL),
    "hf_gemma": _hf("GemmaForCausalLM", "GemmaConfig", head_dim=16, **_DECODER),
    "hf_mixtral": _hf("MixtralForCausalLM", "MixtralConfig",
                      num_local_experts=4, num_experts_per_tok=2, **_DECODER),
    "hf_falcon": _hf("FalconForCausalLM", "FalconConfig", vocab_size=100,
                     hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
    "hf_bloom": _hf("BloomForCausalLM", "BloomConfig", vocab_size=100,
                    hidden_size=64, n_layer=2, n_head=4),
    "hf_swin": _hf("SwinForImageClassification", "SwinConfig", images=True,
                   image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                   num_heads=[2, 2], window_size=4),
    "hf_convnext": _hf("ConvNextForImageClassification", "ConvNextConfig",
                       images=True, hidden_sizes=[16, 32], depths=[1, 1],
                       num_stages=2),
    "hf_clip_vision": _hf("CLIPVisionModel", "CLIPVisionConfig", images=True,
                          image_size=32, patch_size=8, hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4),
    "hf_whisper": _hf_whisper,
    "timm_convnext_atto": _timm("convnext_atto"),
    "timm_vit_tiny": _timm("vit_tiny_patch16_224", img_size=64),
    "timm_efficientvit": _timm("efficientvit_b0"),
    "timm_resnet26d": _timm("resnet26d"),
    "timm_deit_tiny": _timm("deit_tiny_patch16_224", img_size=64),
    "timm_mobilevit": _timm("mobilevit_xxs"),
    "timm_levit": _timm("levit_128s", img_size=64),
    "timm_poolformer": _timm("poolformer_s12"),
    "timm_resmlp": _timm("resmlp_12_224", img_size=64),
    "timm_efficientnet": _timm("efficientnet_b0"),
    "timm_regnetx": _timm("regnetx_002"),
    "timm_coat": _timm("coat_lite_tiny", img_size=64),
    # Added in session 15: architectures with ops the list above lacks
    # (upsampling, grouped/1-d convolutions, LSTMs, weight standardization,
    # relative position tables, token mixing MLPs).
    "tv_mobilenet_v2": _tv("mobilenet_v2"),
    "tv_resnext50": _tv("resnext50_32x4d", batch=1),
    "tv_vgg11": _tv("vgg11_bn", batch=1),
    "tv_alexnet": _tv("alexnet", batch=1),
    "tv_efficientnet_v2_s": _tv("efficientnet_v2_s", batch=1),
    "tv_lraspp": _tv_segmentation("lraspp_mobilenet_v3_large"),
    "tv_deeplabv3": _tv_segmentation("deeplabv3_mobilenet_v3_large"),
    "hf_wav2vec2": _hf_wav2vec2,
    "hf_mobilebert": _hf("MobileBertForMaskedLM", "MobileBertConfig",
                         vocab_size=100, hidden_size=64, embedding_size=32,
                         num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, intra_bottleneck_size=32,
                         true_hidden_size=32, num_feedforward_networks=2),
    "hf_squeezebert": _hf("SqueezeBertForSequenceClassification",
                          "SqueezeBertConfig", embedding_size=64, **_SMALL),
    "hf_segformer": _hf("SegformerForSemanticSegmentation",
                        "SegformerConfig", images=True, num_encoder_blocks=2,
                        depths=[1, 1], sr_ratios=[2, 1],
                        hidden_sizes=[16, 32], patch_sizes=[7, 3],
                        strides=[4, 2], num_attention_heads=[1, 2],
                        mlp_ratios=[2, 2], decoder_hidden_size=32),
    "hf_gpt_bigcode": _hf("GPTBigCodeForCausalLM", "GPTBigCodeConfig",
                          vocab_size=100, n_embd=64, n_layer=2, n_head=4),
    "hf_dinov2": _hf("Dinov2Model", "Dinov2Config", images=True,
                     image_size=32, patch_size=8, **_SMALL),
    "hf_beit": _hf("BeitForImageClassification", "BeitConfig", images=True,
                   image_size=32, patch_size=8,
                   use_relative_position_bias=True, **_SMALL),
    "hf_xlnet": _hf("XLNetLMHeadModel", "XLNetConfig", vocab_size=100,
                    d_model=64, n_layer=2, n_head=4, d_inner=128),
    "timm_nfnet": _timm("nf_resnet26"),
    "timm_ghostnet": _timm("ghostnet_050"),
    "timm_repvgg": _timm("repvgg_a0"),
    "timm_mixer": _timm("mixer_s16_224", img_size=64),
    "timm_sequencer": _timm("sequencer2d_s", img_size=64),
    "timm_xcit": _timm("xcit_nano_12_p16_224", img_size=64),
    "timm_cait": _timm("cait_xxs24_224", img_size=64),
    "timm_hrnet": _timm("hrnet_w18_small"),
    "timm_dla": _timm("dla34"),
    "timm_edgenext": _timm("edgenext_xx_small"),
    # timm >= 1.0 builds TinyViT for any input size (no img_size argument):
    # its windowed attention pads each stage to whole windows.
    "timm_tiny_vit": _timm("tiny_vit_5m_224"),
    "timm_fastvit": _timm("fastvit_t8"),
    # Session 24: video, segmentation and larger classifiers.
    "tv_r3d_18": _tv_video("r3d_18"),
    "tv_r2plus1d_18": _tv_video("r2plus1d_18"),
    "tv_mc3_18": _tv_video("mc3_18"),
    # S3D's head pools 2x7x7 windows: 16 frames of 224 at least.
    "tv_s3d": _tv_video("s3d", frames=16, min_side=224),
    "tv_fcn_resnet50": _tv_segmentation("fcn_resnet50"),
    "tv_inception_v3": _tv("inception_v3", min_image=96, aux_logits=False,
                           init_weights=True),
    "tv_wide_resnet50": _tv("wide_resnet50_2"),
    "tv_regnet_x_400mf": _tv("regnet_x_400mf"),
    "tv_mobilenet_v3_large": _tv("mobilenet_v3_large"),
    "tv_vit_b16": _tv("vit_b_16", batch=1, image_size=None),
}


def _floats(out: Any) -> List[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _floats(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _floats(o)]
    return []


class Mode:
    """How a step runs: training (forward + backward) or inference
    (eval(), no_grad: outputs only), under autocast to `amp` or not."""

    def __init__(self, inference: bool = False,
                 amp: Optional[torch.dtype] = None) -> None:
        self.inference = inference
        self.amp = amp

    def __str__(self) -> str:
        return ("inference" if self.inference else "training") + (
            f", autocast {str(self.amp).split('.')[-1]}" if self.amp else "")


def _step(call: Callable[..., Any], params: nn.Module,
          inputs: Tuple[Any, ...], mode: Mode = Mode(),
          exact: bool = False) -> Dict[str, torch.Tensor]:
    """One step; the outputs and every parameter's gradient, by name.
    `exact`: the float64 reference, which runs without autocast."""
    amp = None if exact else mode.amp
    with contextlib.ExitStack() as stack:
        if mode.inference:
            stack.enter_context(torch.no_grad())
        if amp is not None:
            stack.enter_context(torch.autocast(inputs[0].device.type,
                                               dtype=amp))
        outs = _floats(call(*inputs))
        if mode.inference:
            return {f"out{i}": o.detach() for i, o in enumerate(outs)}
    torch.stack([o.double().square().mean() for o in outs]).sum().backward()
    result = {f"out{i}": o.detach() for i, o in enumerate(outs)}
    result.update({n: p.grad for n, p in params.named_parameters()
                   if p.grad is not None})
    return result


def _quiet_randomness(model: nn.Module) -> None:
    if KEEP_DROPOUT:
        return
    for m in model.modules():
        kind = type(m).__name__
        if isinstance(m, nn.Dropout) or "Drop" in kind or "Stochastic" in kind:
            if hasattr(m, "p"):
                m.p = 0.0
            if hasattr(m, "drop_prob"):
                m.drop_prob = 0.0


def _rel(x: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """x's largest difference from ref over ref's largest magnitude, or over
    `floor` where that is larger; NaN where ref has none (or none where
    ref has NaN) is an infinite error, NaN where ref has NaN none."""
    x, ref = x.double(), ref.double()
    if x.shape != ref.shape:
        return math.inf
    nan = torch.isnan(ref)
    if not torch.equal(torch.isnan(x), nan):
        return math.inf
    x, ref = x[~nan], ref[~nan]
    if ref.numel() == 0:
        return 0.0
    diff = (x - ref).abs().max().item()
    if diff != diff or diff == math.inf:  # an infinity where ref differs
        return 0.0 if torch.equal(x, ref) else math.inf
    return diff / max(ref.abs().max().item(), floor, 1e-12)


# The smallest magnitude errors are measured against, as a share of the
# largest result of the step: a gradient that is zero in exact arithmetic
# (a batch norm's bias before another batch norm, which removes any shift;
# timm's RepViT) is float32 rounding in Kiln (2e-10) and exactly 0.0 in
# eager, so its error over its own magnitude (0.0 in float64) says nothing.
_FLOOR_SHARE = 1e-5


def _ms_per_step(call: Callable[..., Any], params: nn.Module,
                 inputs: Tuple[Any, ...], mode: Mode, steps: int) -> float:
    """Milliseconds per step (grads zeroed, forward, loss, backward) over
    `steps` steps after two warm-up steps, synchronizing a GPU."""

    def step() -> None:
        params.zero_grad(set_to_none=True)
        _step(call, params, inputs, mode)

    return ms_per_call(step, steps, inputs[0].is_cuda)


def _nudged_step(model: nn.Module, inputs: Tuple[Any, ...],
                 mode: Mode) -> Dict[str, torch.Tensor]:
    """Eager's step with every floating parameter and input multiplied by
    1 + 2^-20 * N(0, 1) (a few float32 ulps): how far rounding-sized
    changes move this step's results, the yardstick for SENSITIVE."""
    gen = torch.Generator().manual_seed(1)

    def nudge(t: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(t.shape, generator=gen).to(t.device, t.dtype)
        return t * (1 + noise * 2.0 ** -20)

    nudged = copy.deepcopy(model)
    with torch.no_grad():
        for p in nudged.parameters():
            if p.is_floating_point():
                p.copy_(nudge(p))
    return _step(nudged, nudged, tuple(
        nudge(x) if x.is_floating_point() else x for x in inputs), mode)


def run_model(name: str, server: str, dynamic: bool,
              device: torch.device, baseline: str = "",
              mode: Mode = Mode(), timed_steps: int = 0) -> Tuple[str, str]:
    torch.manual_seed(0)
    try:
        model, inputs = _model(name)
    except Exception as e:  # noqa: BLE001
        # The library is missing, or its installed version builds the model
        # with other arguments (timm 1.0.31's TinyViT takes no img_size),
        # or a timm:/hf: model's configuration does not take these sizes.
        return "SKIPPED", f"{type(e).__name__}: {e}"[:300]
    _quiet_randomness(model)
    if CHECKPOINTING:
        hf = next((m for m in model.modules()
                   if hasattr(m, "gradient_checkpointing_enable")), None)
        if hf is None:
            return "SKIPPED", "no gradient_checkpointing_enable"
        hf.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train(not mode.inference)
    model = model.to(device)
    inputs = tuple(x.to(device) for x in inputs)
    eager_model = copy.deepcopy(model)
    try:
        eager = _step(eager_model, eager_model, inputs, mode)
    except Exception as e:  # noqa: BLE001 (the model at these sizes)
        return "SKIPPED", f"eager raised {type(e).__name__}: {e}"[:300]
    exact_model = copy.deepcopy(model).double()
    try:
        exact = _step(exact_model, exact_model, tuple(
            x.double() if x.is_floating_point() else x for x in inputs),
            mode, exact=True)
    except RuntimeError:  # an op without float64 (Mixtral's grouped_mm):
        # float32 without autocast, or eager itself when that is the mode
        exact_model = copy.deepcopy(model)
        exact = (_step(exact_model, exact_model, inputs, mode, exact=True)
                 if mode.amp else eager)
    try:
        first = _first_step(model, inputs, mode, server, dynamic, baseline)
    except Exception as e:  # noqa: BLE001 (reported per model)
        traceback.print_exc()
        return "ERROR", f"{type(e).__name__}: {str(e)[:300]}"
    backend, mine, compiled, got, seconds, caught = first
    status, worst, sensitive = _compare(got, eager, exact, model, inputs, mode)
    if status == "MISMATCH" and not worst[0]:
        return status, worst[1]
    warm = ""
    if WARM and not baseline:
        # A new Dynamo, backend and client (kilnd's and the AOT cache's
        # entries stay): what a restarted process's first step finds.
        kiln.dynamo._drop_client(server, 1)
        try:
            warm_backend, _, _, got_warm, warm_seconds, caught_warm = \
                _first_step(model, inputs, mode, server, dynamic, "")
        except Exception as e:  # noqa: BLE001 (reported per model)
            traceback.print_exc()
            return "ERROR", f"warm: {type(e).__name__}: {str(e)[:300]}"
        caught += caught_warm
        w_status, w_worst, _ = _compare(got_warm, eager, exact, model, inputs,
                                        mode)
        if w_status == "MISMATCH":
            status = "MISMATCH"
            worst = (w_worst[0], "warm: " + w_worst[1])
        first_counts = backend.aot_cache_counters()
        warm = (f", warm first step {warm_seconds:.1f} s (AOT cache "
                f"{warm_backend.aot_cache_counters()['hits']} hits of "
                f"{first_counts['stored']} stored, "
                f"{first_counts['uncacheable']} not cacheable)")
    messages = (str(w.message) for w in caught)
    fell_back = sorted({m for m in messages
                        if m.startswith("kiln:") and "eagerly" in m})
    if fell_back and status == "OK":
        status = "FALLBACK"
    r = backend.report
    n = r.kiln_nodes + r.fallback_nodes
    edge = sum(count for reasons in r.fallbacks.values()
               for reason, count in reasons.items() if "edge" in reason)
    line = (f"{r.kiln_nodes}/{n} ({100.0 * r.kiln_nodes / max(n, 1):.1f}%; "
            f"{100.0 * r.kiln_nodes / max(n - edge, 1):.1f}% without the "
            f"{edge} views at edges) graphs={r.graphs} "
            f"partitions={r.compiled_partitions} "
            f"first step {seconds:.1f} s{warm}; worst vs float64 {worst[1]}")
    if sensitive:
        line += (f"\n      {len(sensitive)} result(s) as far from float64 as "
                 f"eager's nudged step, e.g. {sensitive[0]}")
    if timed_steps:
        # Kiln and eager, then Inductor compiled afresh (its warm-up step
        # compiles), in this process on the same inputs.
        kiln_ms = _ms_per_step(compiled, mine, inputs, mode, timed_steps)
        eager_ms = _ms_per_step(eager_model, eager_model, inputs, mode,
                                timed_steps)
        torch._dynamo.reset()
        ind_model = copy.deepcopy(model)
        ind = torch.compile(ind_model, dynamic=dynamic or None,
                            mode="reduce-overhead" if CUDAGRAPHS else None)
        ind_ms = _ms_per_step(ind, ind_model, inputs, mode, timed_steps)
        line += (f"\n      step ms: kiln {kiln_ms:.2f}, inductor {ind_ms:.2f}"
                 f", eager {eager_ms:.2f} (kiln/inductor "
                 f"{kiln_ms / ind_ms:.2f}, kiln/eager "
                 f"{kiln_ms / eager_ms:.2f})")
    for op, reasons in r.fallbacks.items():
        for reason, count in reasons.items():
            line += f"\n      {op:<40} x{count:<3} {reason[:100]}"
    for message in fell_back:
        line += f"\n      warned: {message[:300]}"
    return status, line


def _first_step(model: nn.Module, inputs: Tuple[Any, ...], mode: Any,
                server: str, dynamic: bool, baseline: str) -> Tuple[Any, ...]:
    """A copy of `model` compiled afresh (Dynamo reset) with a new Kiln
    backend (or `baseline`) and its first step: (backend, the copy, the
    compiled module, the step's results, its seconds, the warnings it
    raised). The step's exception propagates."""
    torch._dynamo.reset()
    backend = kiln.backend(server=server, fallback="eager",
                           cudagraphs=CUDAGRAPHS)
    mine = copy.deepcopy(model)
    compiled = torch.compile(mine, backend=baseline or backend,
                             dynamic=dynamic or None)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _step(compiled, mine, inputs, mode)
    return backend, mine, compiled, got, time.perf_counter() - start, caught


def _compare(got: Dict[str, torch.Tensor], eager: Dict[str, torch.Tensor],
             exact: Dict[str, torch.Tensor], model: nn.Module,
             inputs: Tuple[Any, ...], mode: Any
             ) -> Tuple[str, Tuple[float, str], List[str]]:
    """Kiln's step against float64 and eager's (the module docstring):
    (status, (worst ratio, its line), sensitive results). A missing or
    non-finite result is MISMATCH with ratio 0 and the reason."""
    worst, status = (0.0, "none (Kiln equals float64 everywhere)"), "OK"
    nudged: Optional[Dict[str, torch.Tensor]] = None
    sensitive: List[str] = []
    floor = _FLOOR_SHARE * max(
        (r.double().abs().nan_to_num(0.0, 0.0, 0.0).max().item()
         for r in exact.values() if r.numel()), default=0.0)
    for key, ref in exact.items():
        if key not in got:
            return "MISMATCH", (0.0, f"no gradient for {key}"), []
        if KEEP_DROPOUT:  # different draws: finite results only
            if not torch.isfinite(got[key]).all():
                return "MISMATCH", (0.0, f"{key} is not finite (dropout "
                                         f"kept)"), []
            worst = (0.0, "not compared (dropout kept)")
            continue
        e_kiln = _rel(got[key], ref, floor)
        e_eager = _rel(eager[key], ref, floor)
        ratio = e_kiln / max(e_eager, 1e-7)
        if e_kiln > 1e-4 and e_kiln > 20 * e_eager:
            if nudged is None:
                nudged = _nudged_step(model, inputs, mode)
            e_nudged = _rel(nudged[key], ref, floor)
            if e_kiln <= 2 * e_nudged:
                status = "SENSITIVE" if status == "OK" else status
                sensitive.append(f"{key}: kiln {e_kiln:.1e}, eager "
                                 f"{e_eager:.1e}, eager nudged {e_nudged:.1e}")
                continue
            status = "MISMATCH"
        if ratio > worst[0]:
            worst = (ratio, f"{key}: kiln {e_kiln:.1e}, eager {e_eager:.1e}")
    return status, worst, sensitive


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"of {', '.join(MODELS)}; "
                    "or timm:NAME, any timm architecture; or hf:CLASS, "
                    "any transformers text model")
    ap.add_argument("--dynamic", action="store_true", help="dynamic=True")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--inference", action="store_true",
                    help="eval() and no_grad: the outputs only")
    ap.add_argument("--amp", choices=["bfloat16", "float16"],
                    help="the step under torch.autocast to this dtype "
                    "(the float64 reference without)")
    ap.add_argument("--baseline", default="", metavar="BACKEND",
                    help="a torch backend (aot_eager, inductor) instead of "
                    "Kiln: the same checks, and its first-step time to "
                    "compare (no node counts)")
    ap.add_argument("--time", type=int, default=0, metavar="N",
                    help="also time N steps of Kiln, eager and Inductor "
                    "(compiled after Kiln's, same process and inputs)")
    ap.add_argument("--scale", type=int, default=1,
                    help="multiply every batch by this")
    ap.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    ap.add_argument("--image", type=int, default=64,
                    help="torchvision/timm image size")
    ap.add_argument("--server", help="kilnd's address (default: a private "
                    "kilnd on an ephemeral port with a fresh cache)")
    ap.add_argument("--dropout", action="store_true",
                    help="keep the models' dropout (results checked for "
                    "being finite only)")
    ap.add_argument("--checkpointing", action="store_true",
                    help="the Hugging Face models' gradient checkpointing "
                    "on (the others SKIPPED)")
    ap.add_argument("--cudagraphs", action="store_true",
                    help="Kiln with cudagraphs=True and the Inductor "
                    "baseline with mode='reduce-overhead' (CUDA only)")
    ap.add_argument("--warm", action="store_true",
                    help="after each model's first compiled step, a second "
                    "first step as a restarted process finds it: Dynamo "
                    "reset, a new backend and client, kilnd's artifacts and "
                    "the AOT cache's entries (kiln/aot_cache.py) from the "
                    "first; checked the same way, its time and AOT cache "
                    "hits printed")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True for every "
                    "backend")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    global SCALE, SEQ, IMAGE, KEEP_DROPOUT, CHECKPOINTING  # noqa: PLW0603
    global CUDAGRAPHS  # noqa: PLW0603
    SCALE, SEQ, IMAGE = a.scale, a.seq, a.image
    KEEP_DROPOUT, CHECKPOINTING = a.dropout, a.checkpointing
    CUDAGRAPHS = a.cudagraphs
    global WARM  # noqa: PLW0603
    WARM = a.warm
    daemon = None if a.server else Kilnd()
    server = a.server or daemon.address
    rows = []
    mode = Mode(a.inference, getattr(torch, a.amp) if a.amp else None)
    try:
        print(f"kiln real models: torch {torch.__version__}, {a.device}, "
              f"{'dynamic' if a.dynamic else 'static'}, {mode}\n",
              flush=True)
        for name in a.names or MODELS:
            status, line = run_model(name, server, a.dynamic,
                                     torch.device(a.device), a.baseline,
                                     mode, a.time)
            rows.append((name, status, line))
            print(f"{name:<24} {status:<8} {line}", flush=True)
    finally:
        if daemon:
            daemon.stop()
    counts = {s: sum(1 for _, st, _ in rows if st == s)
              for s in ("OK", "SENSITIVE", "FALLBACK", "MISMATCH", "ERROR",
                        "SKIPPED")}
    print("\n" + ", ".join(f"{c} {s}" for s, c in counts.items()))
    sys.exit(1 if counts["MISMATCH"] or counts["ERROR"] or counts["FALLBACK"]
             else 0)


if __name__ == "__main__":
    main()
