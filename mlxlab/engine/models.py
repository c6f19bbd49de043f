"""Loading a model: :func:`load_model` and what it returns, :class:`LoadedModel`.

A preset (a Hugging Face style config, :mod:`mlxlab.core.presets`) is built as the matching
mlx-lm model with random weights (throughput does not depend on the values); a path to a local
mlx-lm model directory loads its real weights instead. Either may be cast and quantized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, get_total_parameters
from mlx_lm.utils import load_model as _mlx_lm_load_model

from mlxlab.core.presets import model_limits, preset_config

VALID_BITS = (2, 3, 4, 5, 6, 8)
VALID_GROUP_SIZES = (32, 64, 128)
_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}

# mlx's default nn.Linear init is uniform(+-1/sqrt(fan_in)), std 1/sqrt(3*fan_in).
# With it every sublayer of a random model is contractive: the residual stream is
# a slowly changing average over the context, and greedy decoding of tiny/small
# repeats one token for 30-60 steps. Scaling Linear weights to std 2/sqrt(fan_in)
# makes the random network chaotic: greedy continuations change token at almost
# every step and differ by prompt, so tests that compare batched decoding with a
# reference decode catch position and cache bugs. Logits stay ~N(0, 1) because
# of the final RMSNorm and the 1/sqrt(hidden) embedding init.
INIT_GAIN = 2.0 * math.sqrt(3.0)


def resolve_dtype(dtype: Union[None, str, mx.Dtype]) -> mx.Dtype:
    """None -> float32 on the CPU, bfloat16 on a GPU; else a name or an mx dtype."""
    if dtype is None:
        return mx.float32 if mx.default_device().type == mx.DeviceType.cpu else mx.bfloat16
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(_DTYPES)}")
        return _DTYPES[dtype]
    if isinstance(dtype, mx.Dtype) and dtype in _DTYPES.values():
        return dtype
    raise ValueError(f"unsupported dtype {dtype!r}; valid: {', '.join(_DTYPES)}")


@dataclass
class LoadedModel:
    """A built mlx-lm model plus what it was built from.

    ``module`` is the mlx-lm ``nn.Module`` (call it with token ids of shape
    (B, L) to get logits (B, L, vocab)); ``config`` the architecture dict (with
    ``quantization`` when quantized); ``dtype`` the floating dtype of the
    parameters and activations; ``bits``/``group_size`` the weight quantization
    (``bits`` None when unquantized); ``num_params`` the logical parameter
    count of the unquantized architecture (a count, not bytes).
    """

    module: nn.Module
    config: dict
    name: str
    dtype: mx.Dtype
    bits: Optional[int]
    group_size: int
    seed: int
    num_params: int

    def __repr__(self) -> str:
        bits = f"{self.bits}-bit weights" if self.bits else "unquantized"
        return (f"LoadedModel({self.name!r}: {self.num_params / 1e6:.1f}M params, {str(self.dtype).split('.')[-1]}, "
                f"{bits}, {self.nbytes / 2**20:.1f} MiB)")

    @property
    def nbytes(self) -> int:
        """Bytes actually held by all arrays of the module (packed weights,
        scales and biases included)."""
        return sum(v.nbytes for _, v in tree_flatten(self.module.parameters()))

    @property
    def vocab_size(self) -> int:
        return model_limits(self.config)[0]

    @property
    def max_context(self) -> int:
        """Maximum positions (tokens): max_position_embeddings, else
        :data:`mlxlab.core.presets.DEFAULT_MAX_CONTEXT`."""
        return model_limits(self.config)[1]

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def num_kv_heads(self) -> int:
        c = self.config
        return int(c.get("num_key_value_heads") or c["num_attention_heads"])

    @property
    def head_dim(self) -> int:
        c = self.config
        return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])

    def kv_bytes_per_token(
        self, kv_bits: Optional[int] = None, kv_group_size: Optional[int] = None
    ) -> int:
        """Bytes of KV cache one token occupies across all layers (K and V).

        ``kv_bits`` None: 2 * layers * kv_heads * head_dim * dtype size.
        Quantized (as mlx stores it): each head vector of ``head_dim`` values
        takes head_dim * kv_bits / 8 bytes plus, per group of ``kv_group_size``
        (default: this model's ``group_size``) values, a scale and a bias in
        ``dtype``.
        """
        n = 2 * self.num_layers * self.num_kv_heads
        if kv_bits is None:
            return n * self.head_dim * self.dtype.size
        if kv_bits not in VALID_BITS:
            raise ValueError(f"invalid kv_bits {kv_bits}; valid: {VALID_BITS}")
        g = kv_group_size or self.group_size
        if self.head_dim % g:
            raise ValueError(f"head_dim {self.head_dim} is not a multiple of group size {g}")
        per_vector = self.head_dim * kv_bits // 8 + (self.head_dim // g) * 2 * self.dtype.size
        return n * per_vector


def _quantize(module: nn.Module, config: dict, bits: int, group_size: int) -> None:
    def predicate(path: str, m: nn.Module) -> bool:
        # like mlx_lm.utils.quantize_model: skip layers whose rows don't split into groups
        return hasattr(m, "to_quantized") and m.weight.shape[-1] % group_size == 0

    nn.quantize(module, group_size=group_size, bits=bits, class_predicate=predicate)
    q = {"group_size": group_size, "bits": bits, "mode": "affine"}
    config["quantization"] = q
    config["quantization_config"] = dict(q)


def _from_directory(path: Path, bits: Optional[int], group_size: int):
    """mlx-lm's loader on a local model directory: (module, config, bits, group_size), the
    quantization the directory already has taking the place of ``bits``/``group_size``."""
    module, config = _mlx_lm_load_model(path)
    if (q := config.get("quantization")) is not None:
        if bits is not None:
            raise ValueError(f"{path} is already quantized ({q.get('bits')} bits)")
        bits, group_size = q.get("bits"), q.get("group_size", group_size)
    return module, config, bits, group_size


def _from_preset(name: str, seed: int):
    """Preset ``name`` with seeded random weights, Linear weights scaled by ``INIT_GAIN``: (module, config)."""
    config = preset_config(name)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    module = model_cls(args_cls.from_dict(config))
    for _, m in module.named_modules():
        if isinstance(m, nn.Linear):
            m.weight = m.weight * INIT_GAIN  # see INIT_GAIN
    module.eval()
    return module, config


def materialize(module: nn.Module) -> None:
    """Evaluate every array the module holds: its parameters and the private ones
    ``parameters()`` leaves out (llama3 RoPE's ``_freqs``, made lazily when the model is built).
    A lazy array belongs to the stream of the thread that made it; left for overlap mode's
    prefill thread to evaluate first, it fails there ("There is no Stream(gpu, 0) in current
    thread", mlx CUDA). Already evaluated arrays cost nothing."""
    private = [v for m in module.modules() for k, v in m.items() if k.startswith("_") and isinstance(v, mx.array)]
    mx.eval(module.parameters(), private)


def load_model(
    name_or_path: Union[str, Path],
    *,
    seed: int = 0,
    dtype: Union[None, str, mx.Dtype] = None,
    bits: Optional[int] = None,
    group_size: int = 64,
) -> LoadedModel:
    """Build a preset with random weights, or load a local mlx-lm model directory.

    A preset name (see ``available_presets()``) is built with
    ``mx.random.seed(seed)`` first (this reseeds mlx's global generator), so
    equal seeds give identical weights; Linear weights are scaled by
    ``INIT_GAIN``. An existing directory is loaded with mlx-lm's loader
    (weights and config.json; no tokenizer). Floating parameters are cast to ``dtype``
    (see ``resolve_dtype``); then, if ``bits`` is given, Linear and Embedding
    layers are affine-quantized with ``group_size``. All parameters are
    evaluated before returning. Raises ValueError for an unknown name, an
    invalid ``bits``/``group_size`` or re-quantizing a quantized directory.
    """
    if bits is not None and bits not in VALID_BITS:
        raise ValueError(f"invalid bits {bits!r}; valid: {', '.join(map(str, VALID_BITS))}")
    if bits is not None and group_size not in VALID_GROUP_SIZES:
        raise ValueError(f"invalid group_size {group_size!r}; valid: {VALID_GROUP_SIZES}")
    dt = resolve_dtype(dtype)
    path = Path(name_or_path)
    if path.is_dir():
        module, config, bits, group_size = _from_directory(path, bits, group_size)
        name = str(path)
    else:
        module, config = _from_preset(str(name_or_path), seed)
        name = str(name_or_path)
    num_params = get_total_parameters(module)
    module.set_dtype(dt)  # lazily: float32 random weights never all materialize
    if bits is not None and config.get("quantization") is None:
        _quantize(module, config, bits, group_size)
    materialize(module)
    return LoadedModel(module=module, config=config, name=name, dtype=dt, bits=bits, group_size=group_size,
                       seed=seed, num_params=num_params)
