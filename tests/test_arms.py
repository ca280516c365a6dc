"""The arms and their kinds' options: config validation of every arm's cycle and of the
per-kind fields, and the compiled decode step's temporaries over a hybrid's cycle. (What every
kind must do in every arm is tests/test_kind_conformance.py and test_kind_declarations.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from helpers import tiny_config, validated

from orthros_jax import inference as inf
from orthros_jax.config import ModelConfig
from orthros_jax.model import init_params

GDN = dict(
    kinds=dict(
        gdn=dict(num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=6, conv_kernel=3, chunk=4)
    ),
)


def test_arms_and_layer_types_validated():
    assert ModelConfig(architecture="gdn").layer_types == ("gdn",)
    hyb = ModelConfig(architecture="hybrid", n_layers=8)
    assert hyb.layer_types == ("gdn", "gdn", "gdn", "attention")
    assert hyb.base_window is None and not hyb.two_streams and not hyb.scale_offset
    oh = ModelConfig(architecture="orthros_h", n_layers=4)
    assert oh.base_window == oh.window and oh.two_streams and oh.scale_offset
    with pytest.raises(ValueError, match="does not fit architecture 'gdn'"):
        validated(architecture="gdn", layer_types=("gdn", "attention"))
    with pytest.raises(ValueError, match=r"needs \['attention'\] layers and recurrent ones"):
        validated(architecture="hybrid", layer_types=("attention",))
    with pytest.raises(ValueError, match="only 'attention' layers"):
        validated(architecture="orthros", layer_types=("gdn",))
    with pytest.raises(ValueError, match=r"kinds\.gdn\.chunk must be a positive int"):
        validated(architecture="gdn", kinds=dict(gdn=dict(chunk=0)))
    with pytest.raises(ValueError, match=r"kinds\.gdn\.num_v_heads=3 must be a multiple"):
        validated(architecture="gdn", kinds=dict(gdn=dict(num_k_heads=2, num_v_heads=3)))
    with pytest.raises(ValueError, match="scale_offset=True needs a two-stream"):
        validated(architecture="hybrid", n_layers=4, scale_offset=True)


def test_arms_and_fields_validated():
    assert ModelConfig(architecture="gla").layer_types == ("gla",)
    assert ModelConfig(architecture="retnet").layer_types == ("retention",)
    bad = [
        (dict(architecture="gla", layer_types=("gla", "attention")), "architecture 'gla'"),
        (dict(architecture="retnet", layer_types=("gla",)), "architecture 'retnet'"),
        (dict(architecture="hybrid", layer_types=("gla", "retention")), r"recurrent ones \(any"),
        (
            dict(architecture="gla", kinds=dict(gla=dict(heads=4, kv_heads=3))),
            "kinds.gla.heads=4 must be a multiple",
        ),
        (
            dict(architecture="retnet", kinds=dict(retention=dict(feature_map="hedgehog"))),
            "kinds.retention.feature_map='hedgehog'",
        ),
        (
            dict(architecture="retnet", kinds=dict(retention=dict(k_head_dim=5))),
            "kinds.retention.k_head_dim=5 must be even",
        ),
        (dict(architecture="gla", kinds=dict(gla=dict(clamp_min=0.5))), "kinds.gla.clamp_min=0.5"),
        (
            dict(architecture="gla", kinds=dict(gla=dict(gate_normalizer=0.0))),
            "kinds.gla.gate_normalizer must be > 0",
        ),
        (
            dict(architecture="gla", kinds=dict(gla=dict(chunk=0))),
            "kinds.gla.chunk must be a positive int",
        ),
    ]
    for fields, match in bad:
        with pytest.raises(ValueError, match=match):
            validated(n_layers=4, **fields)
    hyb = ModelConfig(architecture="orthros_h", layer_types=("retention", "attention"))
    assert hyb.two_streams and hyb.layers_of("retention") == 2


@pytest.mark.slow
@pytest.mark.optimized  # about the compiled program
def test_decode_temporaries_do_not_grow_with_the_cycle():
    # XLA:CPU copies each dynamically indexed weight slice before its dot; were every layer's
    # copy of a mixed cycle hoisted to the top of the loop body (as its scheduler does unless a
    # layer's index depends on the layer before), the temporaries would grow with the cycle:
    # 6.8 MB for (gdn, attention) and 13.3 MB for (gdn, gdn, gdn, attention) at this width.
    from orthros_jax.inference import drivers

    def temp_bytes(cycle: tuple[str, ...]) -> int:
        cfg = tiny_config(
            architecture="hybrid",
            layer_types=cycle,
            n_layers=2 * len(cycle),
            d_model=256,
            head_dim=32,
            d_ff=1024,
            **GDN,
        )
        params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
        cache = jax.eval_shape(lambda: inf.init_cache(cfg, 1, 16))
        tok, act = jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((1,), bool)
        compiled = drivers.decode_jit.lower(params, cache, tok, act, cfg=cfg).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    short, long = temp_bytes(("gdn", "attention")), temp_bytes(("gdn", "gdn", "gdn", "attention"))
    assert long <= 1.1 * short, (short, long)
