"""The layer kinds by name, and the arms made of them. Adding a kind = its module in layers/
and one line in KINDS (plus a row in the arms' table for a pure stack of it;
docs/adding_a_layer_kind.md); config validation and options sections, the cache, shardings,
FLOP and parameter counts, the weight-decay mask, export and scale-offset discovery all read
these tables."""

from __future__ import annotations

from orthros_jax import config_registry
from orthros_jax.arms import ATTN_RUNS, CONVERT, CONVERT_RUNS, LM, MQAR, RECALL, Arm
from orthros_jax.config import ModelConfig
from orthros_jax.layers import attend, attention, gdn, gla, mamba2, retention
from orthros_jax.layers.cudnn import cudnn_attention
from orthros_jax.layers.kind import LayerKind
from orthros_jax.layers.splash import splash

KINDS: dict[str, LayerKind] = {  # each module's KIND (a kind.Kind) is a LayerKind
    attention.KIND.name: attention.KIND,
    gdn.KIND.name: gdn.KIND,
    gla.KIND.name: gla.KIND,
    retention.KIND.name: retention.KIND,
    mamba2.KIND.name: mamba2.KIND,
}

# The accelerator implementations of attention (they import the seam, so they register here).
attend.register("splash", splash)
attend.register("cudnn", cudnn_attention)

for _kind in KINDS.values():
    config_registry.register_layer_kind(
        _kind.name, _kind.validate, recurrent=_kind.recurrent, options=_kind.options
    )


def _check_moe_kinds(cfg: ModelConfig) -> None:
    """The checks of a MoE config that need its kinds: each must end its block in an FFN for
    the MoE to replace (its parameters have the FFN's pre-norm mlp_norm; e.g. not
    kinds.mamba2.ffn=False), and paired routing runs the base stream's last prompt token again
    in prefill's read pass, beside its copy, which every kind must support (reads_last_token)."""
    kinds = [KINDS[k] for k in dict.fromkeys(cfg.layer_types)]
    bare = [k.name for k in kinds if "mlp_norm" not in k.params(cfg)]
    if bare:
        raise ValueError(
            f"ModelConfig.moe with layer_types={cfg.layer_types!r}: the {bare} layers have no "
            "FFN for the MoE FFN to replace"
        )
    alone = [k.name for k in kinds if not k.reads_last_token]
    if cfg.moe_routing == "paired" and alone:
        raise ValueError(
            f"ModelConfig.moe.routing='paired' with layer_types={cfg.layer_types!r}: paired "
            "routing runs the base stream's last prompt token again in prefill's read pass, "
            f"which the {alone} layers cannot; use routing='independent'"
        )


if _check_moe_kinds not in config_registry.MOE_CHECKS:
    config_registry.MOE_CHECKS.append(_check_moe_kinds)

# The paper's arms (orthros_jax/arms.py), in the order of results' tables, made of the kinds
# above; a table, one arm a row (hence unformatted).
_ATTENTION = (attention.KIND.name,)
# The hybrids use Qwen3.5's cycle of three GDN layers and one attention layer.
_HYBRID = (gdn.KIND.name,) * 3 + _ATTENTION
_EVERYWHERE = frozenset({RECALL, LM, CONVERT, MQAR})
# The MoE arms' FFN (ModelConfig.moe): 8 experts, top-2, transformers' load-balancing loss at
# 0.01. d_expert is left to each experiment config, which sizes it at its dense width
# (moe_options.dense_equivalent_d_expert: the k active experts hold the dense FFN's parameters).
_MOE = dict(n_experts=8, top_k=2, aux_loss_coef=0.01)
config_registry.register_arms(
    {
        "transformer": Arm("Transformer", "C0", _ATTENTION, runs=CONVERT_RUNS,
                           default_in=_EVERYWHERE, two_stream_form="orthros"),
        "swa": Arm("SWA", "C7", _ATTENTION, base_window=True, runs=ATTN_RUNS,
                   default_in=frozenset({RECALL, LM, MQAR})),
        "orthros": Arm("Orthros", "C3", _ATTENTION, two_streams=True, base_window=True,
                       runs=CONVERT_RUNS, default_in=_EVERYWHERE),
        "orthros_noso": Arm("Orthros w/o SO", "C1", variant_of="orthros",
                            overrides=(("scale_offset", False),), runs=CONVERT_RUNS,
                            default_in=frozenset({RECALL, LM})),
        # Mixture-of-experts variants (docs/moe.md): paired (the copies read their base
        # token's experts) and independent routing of the output copies.
        "transformer_moe": Arm("Transformer-MoE", "navy", variant_of="transformer",
                               overrides=(("moe", _MOE),), runs=ATTN_RUNS),
        "orthros_moe": Arm("Orthros-MoE", "darkred", variant_of="orthros",
                           overrides=(("moe", _MOE | dict(routing="paired")),), runs=ATTN_RUNS),
        "orthros_moe_independent": Arm(
            "Orthros-MoE (indep.)", "lightcoral", variant_of="orthros",
            overrides=(("moe", _MOE | dict(routing="independent")),), runs=ATTN_RUNS),
        "gdn": Arm("GDN", "C2", (gdn.KIND.name,)),
        "hybrid": Arm("Linear Hybrid", "C4", _HYBRID, any_recurrent=True,
                      two_stream_form="orthros_h"),
        "orthros_h": Arm("Orthros-H", "C5", _HYBRID, two_streams=True, base_window=True,
                         any_recurrent=True),
        # Table 1's other linear baselines (fla's GLA and RetNet) and Mamba-2: pure stacks.
        "gla": Arm("GLA", "C6", (gla.KIND.name,), runs=ATTN_RUNS),
        "retnet": Arm("RetNet", "C8", (retention.KIND.name,), runs=ATTN_RUNS),
        "mamba2": Arm("Mamba-2", "C9", (mamba2.KIND.name,), runs=ATTN_RUNS),
    }
)  # fmt: skip


def kinds_of(cfg: ModelConfig) -> list[LayerKind]:
    """The kinds a config uses, in cycle order, each once."""
    return [KINDS[name] for name in dict.fromkeys(cfg.layer_types)]
