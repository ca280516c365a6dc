"""flash-linear-attention's own GLA / RetNet / Gated DeltaNet models (`fla.models`) running on a
CPU: the model classes, configs, initialisation and `save_pretrained` are fla's, and only the
pieces that call Triton kernels are swapped for plain torch, each the reference math fla itself
ships (`fla/ops/*/naive.py`, `rms_norm_ref`, `rotary_embedding_ref`) or a one-line equivalent:

  GLA ops (chunk / fused_chunk / fused_recurrent)  -> ops/gla/naive.py naive_recurrent_gla
  retention ops (chunk / fused_chunk / parallel / fused_recurrent)
      -> ops/simple_gla/naive.py naive_recurrent_simple_gla with log(1 - 2^(-5-h)) per head
  gated delta rule ops -> in-kernel l2norm (eps 1e-6), sigmoid beta (x2 with negative
      eigenvalues), gate -exp(A_log) softplus(a + dt_bias), value head j reading q/k head
      j // (HV/H) (fused_recurrent.py), then ops/gated_delta_rule/naive.py
  RMSNorm -> rms_norm_ref (fp32);  FusedRMSNormGated -> rms_norm_ref * swish(g) | sigmoid(g)
  RotaryEmbedding -> its own cos/sin tables + rotary_embedding_ref
  ShortConvolution -> torch conv1d (causal, depthwise) + SiLU;  SwiGLULinear -> silu(x) y W^T
  fla's Triton activations (feature maps, the unfused gate) -> torch's

fla's package imports triton at import time (its kernels never run here). Without triton
installed, a stand-in module answers those imports while fla is imported, and fla and the
stand-in leave sys.modules again afterwards: transformers picks fla's Triton kernels for
Qwen3.5's gated delta rule whenever `import fla` works, which would break its CPU path for
every later test in the process. (Real triton installed has the same effect on transformers,
so the convert extra does not install it.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import math
import pathlib
import sys
import types
import warnings
from typing import Any

import numpy as np

TORCH_ACT = {"relu", "sigmoid", "silu", "swish"}


def naive(name: str) -> Any:
    """fla/ops/<name>/naive.py loaded by file path (plain torch)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("flash-linear-attention is not installed (the `convert` extra)")
    path = pathlib.Path(spec.submodule_search_locations[0]) / "ops" / name / "naive.py"
    mod_spec = importlib.util.spec_from_file_location(f"fla_naive_{name}", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _act(name: str | None):
    import torch.nn.functional as F

    return {None: None, "relu": F.relu, "sigmoid": F.sigmoid, "silu": F.silu, "swish": F.silu}[name]


class _NoDriver:
    """triton.runtime.driver without a device: fla then falls back to the CPU."""

    @property
    def active(self) -> Any:
        raise RuntimeError("no triton driver (CPU)")


class _Anything:
    """Stands for any triton object: callable, subscriptable, with any attribute. Called on a
    single function (a decorator such as triton.jit) it wraps that function."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return _Wrapped(args[0])
        return _Anything()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything()

    def __getitem__(self, key: Any) -> Any:
        return _Anything()

    def __iter__(self):
        return iter(())


class _Wrapped(_Anything):
    """A decorated function (a "kernel"): keeps the function and its name."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.__name__, self.arg_names = fn, getattr(fn, "__name__", "kernel"), []


class _StubModule(types.ModuleType):
    """A triton (sub)module: submodules import as stand-ins too, names that look like classes
    are classes (fla subclasses Autotuner), the rest `_Anything`; nothing of it ever runs."""

    def __getattr__(self, attr: str) -> Any:
        if attr == "__version__":
            return "3.4.0"
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in ("runtime", "language", "compiler", "backends", "testing", "tools", "autotuner"):
            return importlib.import_module(f"{self.__name__}.{attr}")
        if (self.__name__, attr) == ("triton.runtime", "driver"):
            return _NoDriver()
        if attr[:1].isupper():
            return type(attr, (_Anything,), {})
        return _Anything()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == "triton" or name.startswith("triton."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def _fla_importable():
    """Imports inside see fla (with the triton stand-in when triton is absent); afterwards
    fla and the stand-in are gone from sys.modules (see the module docstring)."""
    stub = importlib.util.find_spec("triton") is None
    finder = _StubFinder()
    if stub:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if stub:
            sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.split(".")[0] in ("fla", "triton")]:
            del sys.modules[name]


@functools.cache
def fla_models() -> Any:
    """`fla.models` with the torch substitutes installed (once per process)."""
    import torch
    import torch.nn.functional as F

    with warnings.catch_warnings(), _fla_importable():
        warnings.simplefilter("ignore")
        import fla.layers.gated_deltanet as gdn_layer
        import fla.layers.gla as gla_layer
        import fla.layers.multiscale_retention as ret_layer
        import fla.models
        from fla.modules.causal_conv1d.ops import ShortConvolution
        from fla.modules.mlp import SwiGLULinear
        from fla.modules.norm.fused_norm_gate import FusedRMSNormGated
        from fla.modules.norm.layernorm import RMSNorm, rms_norm_ref
        from fla.modules.rotary.ops import RotaryEmbedding, rotary_embedding_ref

    gla_naive = naive("gla").naive_recurrent_gla
    sgla_naive = naive("simple_gla").naive_recurrent_simple_gla
    gdr_naive = naive("gated_delta_rule").naive_recurrent_gated_delta_rule

    def gla_op(q, k, v, g=None, gk=None, initial_state=None, output_final_state=False, **_):
        gate = gk if gk is not None else g
        return gla_naive(q, k, v, gate, initial_state, output_final_state)

    def retention_op(q, k, v, initial_state=None, output_final_state=False, **_):
        n = q.shape[2]
        log_gamma = torch.log(1 - torch.pow(2.0, -5.0 - torch.arange(n, dtype=torch.float32)))
        g = log_gamma.expand(q.shape[0], q.shape[1], n)
        return sgla_naive(
            q, k, v, g, initial_state=initial_state, output_final_state=output_final_state
        )

    def delta_op(
        q,
        k,
        v,
        g,
        beta,
        initial_state=None,
        output_final_state=False,
        A_log=None,
        dt_bias=None,
        allow_neg_eigval=False,
        **_,
    ):
        l2 = lambda x: x / torch.sqrt((x.float() ** 2).sum(-1, keepdim=True) + 1e-6)
        q, k = l2(q), l2(k)
        beta = torch.sigmoid(beta.float()) * (2.0 if allow_neg_eigval else 1.0)
        g = -A_log.float().exp() * F.softplus(g.float() + dt_bias.float())
        rep = v.shape[2] // q.shape[2]
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
        o, s = gdr_naive(
            q, k, v, beta, g, initial_state=initial_state, output_final_state=output_final_state
        )
        return o.to(v.dtype), s

    for name in ("chunk_gla", "fused_chunk_gla", "fused_recurrent_gla"):
        setattr(gla_layer, name, gla_op)
    for name in (
        "chunk_retention",
        "fused_chunk_retention",
        "parallel_retention",
        "fused_recurrent_retention",
    ):
        setattr(ret_layer, name, retention_op)
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        setattr(gdn_layer, name, delta_op)
    gdn_layer.GatedDeltaNet._use_fused_qkv_conv = lambda self, **kw: False

    def weight_of(self, x):  # no weight without elementwise_affine: the identity gain
        return torch.ones(x.shape[-1]) if self.weight is None else self.weight

    def rms_forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        w = weight_of(self, x)
        out = rms_norm_ref(x, w, self.bias, residual, self.eps, prenorm, upcast=True)
        return (out[0], out[1].to(x.dtype)) if prenorm else out

    def gated_forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        y = rms_norm_ref(x, weight_of(self, x), self.bias, None, self.eps, upcast=True).float()
        g = g.float()
        y = y * (torch.sigmoid(g) if self.activation == "sigmoid" else F.silu(g))
        return y.to(x.dtype)

    def rotary_forward(self, q, k, seqlen_offset=0, cu_seqlens=None, max_seqlen=None, **_):
        if cu_seqlens is not None or not isinstance(seqlen_offset, int):
            raise NotImplementedError("the CPU rotary substitute takes one int offset")
        t = q.shape[1] + seqlen_offset
        self._update_cos_sin_cache(max(t, max_seqlen or 0), device=q.device, dtype=q.dtype)
        cos = self._cos_cached[seqlen_offset:t]
        sin = self._sin_cached[seqlen_offset:t]
        return rotary_embedding_ref(q, cos, sin), rotary_embedding_ref(k, cos, sin)

    def conv_forward(
        self,
        x,
        residual=None,
        mask=None,
        cache=None,
        output_final_state=False,
        cu_seqlens=None,
        **_,
    ):
        if cache is not None or cu_seqlens is not None or residual is not None:
            raise NotImplementedError("the CPU conv substitute is cache-free")
        t = x.shape[1]
        y = F.conv1d(
            x.transpose(1, 2),
            self.weight,
            self.bias,
            padding=self.kernel_size[0] - 1,
            groups=self.hidden_size,
        )[..., :t].transpose(1, 2)
        return (F.silu(y) if self.activation else y), None

    RMSNorm.forward = rms_forward
    FusedRMSNormGated.forward = gated_forward
    RotaryEmbedding.forward = rotary_forward
    ShortConvolution.forward = conv_forward
    SwiGLULinear.forward = lambda self, x, y, weight, bias: F.linear(F.silu(x) * y, weight, bias)
    return fla.models


def build(model_type: str, seed: int = 0, **config: Any) -> Any:
    """An fla *ForCausalLM (float32, eval) of model_type gla / retnet / gated_deltanet with its
    own init, then every weight moved off its init (norm weights around 1, the rest with std
    0.3 / sqrt(fan-in)) so that every path matters in a parity test."""
    import torch

    models = fla_models()
    cls, cfg_cls = {
        "gla": (models.GLAForCausalLM, models.GLAConfig),
        "retnet": (models.RetNetForCausalLM, models.RetNetConfig),
        "gated_deltanet": (models.GatedDeltaNetForCausalLM, models.GatedDeltaNetConfig),
    }[model_type]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(cfg_cls(**config)).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and ("norm" in name or name.endswith("bias")):
                p.copy_((1.0 if "norm" in name else 0.0) + 0.3 * noise)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 2 + 0.05))
            elif p.ndim == 1:
                p.copy_(noise)
            else:
                p.copy_(noise * 0.3 / math.sqrt(p.shape[-1]))
        # feature maps and the unfused gate: torch's, not fla's Triton activations
        # (transformers' activation modules, which RetNet uses, are torch already)
        for module in model.modules():
            fm = getattr(module, "feature_map_fn", None)
            if fm is not None and not isinstance(fm, torch.nn.Module):
                module.feature_map_fn = _act(config.get("feature_map"))
            gate = getattr(module, "gate_fn", None)
            if gate is not None and not isinstance(gate, torch.nn.Module):
                module.gate_fn = _act(config.get("hidden_act", "swish"))
    return model


def logits(model: Any, ids: np.ndarray) -> np.ndarray:
    """[B, T] token ids -> float32 logits [B, T, V] (no cache)."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(np.asarray(ids, np.int64)), use_cache=False)
    return out.logits.float().numpy()
