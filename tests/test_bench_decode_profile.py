"""benchmarks/decode_profile.py at a tiny model: the K/V layer-slice copies found in the
compiled HLO (benchmarks/hlo_profile.py) where a layer is read out of a stacked cache and not
where each layer has its own buffer, and the profile's JSON counting them per decode step and
per speculative round."""

from __future__ import annotations

import json
from typing import Any

import jax
import pytest
from helpers import tiny_config

from orthros_jax.model import init_params


def _compiled_reads(read: Any, slots: int) -> tuple:
    from benchmarks import hlo_profile, layer_slices

    cfg = tiny_config(attention_block_cache_kib=4)  # 32 slots a block at batch 2
    shape = layer_slices.ReadShape.of(cfg, 2, slots)
    args = layer_slices.read_args(shape, 1, read.stacked)
    fn = layer_slices.read_layers(read, reads=2, layers=shape.layers, block=shape.block)
    module = hlo_profile.Module.of(fn.lower(*args).compile())
    return module, hlo_profile.classify(module, {shape.stack}, set(), {slots})


def test_layer_slice_copy_found_in_stacked_reads_only():
    from benchmarks.hlo_profile import Part
    from benchmarks.layer_slices import Read

    def cut(parts: dict, part: Any) -> list[str]:
        return [n for n, p in parts.items() if p is part]

    module, parts = _compiled_reads(Read.STACKED_INDEX, slots=96)
    # The loop body copies the layer's K and the layer's V out of their stacks.
    assert len(cut(parts, Part.KV_COPY)) == 2, parts
    assert {module.instructions[n].dims for n in cut(parts, Part.KV_COPY)} == {(2, 2, 96, 8)}
    assert cut(parts, Part.ATTENTION_DOT)
    module, parts = _compiled_reads(Read.STACKED_BLOCKS, slots=96)
    # The blocked read copies 32-slot blocks of the layer's K and V, never the whole layer.
    assert not cut(parts, Part.KV_COPY) and len(cut(parts, Part.KV_BLOCK)) == 2, parts
    blocks = {
        tuple(n for n in module.instructions[i].dims if n != 1) for i in cut(parts, Part.KV_BLOCK)
    }
    assert blocks == {(2, 2, 32, 8)}
    assert cut(parts, Part.ATTENTION_DOT)
    _, parts = _compiled_reads(Read.PER_LAYER, slots=96)
    assert not cut(parts, Part.KV_COPY) and not cut(parts, Part.KV_BLOCK)
    assert cut(parts, Part.ATTENTION_DOT)


def test_settings_refuse_bad_input_by_flag_name():
    from benchmarks.decode_profile import Settings

    with pytest.raises(ValueError, match="--k must be >= 1"):
        Settings(k=0)
    with pytest.raises(ValueError, match="--new must be >= 2"):
        Settings(new=1)
    with pytest.raises(ValueError, match="--aot_targets: unknown target 'h200x1'"):
        Settings(aot_targets=("h200x1",))


@pytest.mark.slow  # 5-8 s: two generate loops and two decode steps compile and run
def test_decode_profile_tiny(tmp_path):
    from benchmarks import decode_profile

    # One key block as long as the cache: the cached read copies whole layers (as before the
    # blocked read), so the copies per step are known exactly.
    cfg = tiny_config(vocab_size=64, attention_block_cache_kib=32)  # 256 slots
    params = init_params(cfg, jax.random.PRNGKey(0))
    s = decode_profile.Settings(contexts=(200,), batch=2, k=2, new=5, repeats=1, reads=2)
    decode_profile.run(str(tmp_path), cfg, params, "tiny", ["profile", "slices"], s)
    res = json.loads((tmp_path / "decode_profile.json").read_text())
    plain, spec = res["profile"]
    assert (plain["loop"], spec["loop"]) == ("plain", "speculative")
    assert plain["slots"] == spec["slots"] == 256
    layers, steps, rounds = cfg.n_layers, s.new - 1, spec["steps"]
    for row in (plain, spec):
        assert set(row["parts"]) == {
            "kv_copy",
            "kv_block",
            "weight_copy",
            "attention_dot",
            "slots_other",
            "rest",
        }
        # one layer's K and V, [B, K, S, H] (XLA may keep the stack's unit axis in front)
        copies = [[n for n in d if n != 1] for _, d, part in row["kv_copies"] if part == "kv_copy"]
        assert copies == [[2, cfg.n_kv_heads, 256, 8]] * 2
        total = sum(p["ms"] for p in row["parts"].values())
        assert row["thunks_ms"] == pytest.approx(total) and total > 0 and row["wall_ms"] > 0
    # Every decode step copies each layer's K and V once.
    assert plain["parts"]["kv_copy"]["calls"] == 2 * layers * steps
    assert plain["parts"]["weight_copy"]["calls"] > 0
    # Speculative: the draft steps read the window only; the verify pass copies each layer's
    # K and V once per round.
    assert 1 <= rounds <= steps
    regions = spec["regions"]
    assert regions["draft"]["kv_copy"]["calls"] == 0
    assert regions["verify"]["kv_copy"]["calls"] == 2 * layers * rounds
    assert regions["draft"]["rest"]["calls"] > 0
    assert spec["draft_step_in_loop_ms"] == pytest.approx(spec["draft_ms_per_round"] / s.k)
    (alone,) = res["standalone"]
    for step in ("decode_step", "draft_step"):
        assert alone[step]["wall_ms"] > 0 and alone[step]["thunks_ms"] > 0
    one, five = res["slices"]
    assert (one["queries"], five["queries"]) == (1, s.k + 1)
    for row in (one, five):
        assert row["stacked_index_copies"] == 2 and row["per_layer_copies"] == 0
        assert row["stacked_static_copies"] >= 2
        # (one key block as long as the cache here: the blocked read's block is the layer)
        assert row["stacked_blocks_copies"] + row["stacked_blocks_block_copies"] == 2
        assert row["per_layer_block_copies"] == 0
        assert row["stacked_index_over_per_layer"] > 0 and row["stacked_blocks_over_per_layer"] > 0
    md = (tmp_path / "decode_profile.md").read_text()
    assert "| 200 | speculative |" in md and "## slices" in md
