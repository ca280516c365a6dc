"""Packing variable-length elements into fixed [B, T] rows (grain first-fit) and the batch contract.

Elements (from pipeline.py / sft.py) are dicts of 1-D int32 arrays:

    PT:  tokens [n], targets [n]                 (targets[i] = the token after tokens[i])
    SFT: tokens [n], out_idx [m], targets [m]    (out_idx: local indices that predict targets)

`grain.experimental.FirstFitPackIterDataset` packs each feature into its own capacity
(tokens -> T, out_idx/targets -> T_out) and writes `tokens_segment_ids` (1, 2, ... per
element in a row, 0 = padding) and `tokens_positions` (0.. per element); grain fills a
row left to right, so an element's tokens are contiguous and its segments appear in
increasing order. `finalize_*` turn a batch of packed rows into the training contract:

    PT:  tokens, positions, segment_ids, targets [B, T] int32; loss_mask [B, T] float32
    SFT: tokens, positions, segment_ids [B, T] int32; output_positions, targets [B, T_out]
         int32; loss_mask [B, T_out] float32 (padded outputs point at index 0, mask 0)
"""

from __future__ import annotations

import grain
import numpy as np

PT_KEYS: tuple[str, ...] = ("tokens", "positions", "segment_ids", "targets", "loss_mask")
SFT_KEYS: tuple[str, ...] = (
    "tokens",
    "positions",
    "segment_ids",
    "output_positions",
    "targets",
    "loss_mask",
)


def pack(
    ds: grain.IterDataset,
    kind: str,
    *,
    seq_len: int,
    out_len: int,
    num_bins: int,
    seed: int,
    shuffle_bins: bool,
    token_features: tuple[str, ...] = (),
) -> grain.IterDataset:
    """First-fit packs elements into rows of seq_len tokens (and out_len outputs for SFT);
    token_features: further per-token PT features packed (zero-padded) with the tokens."""
    if kind == "pt":
        length_struct = {"tokens": seq_len, "targets": seq_len}
        length_struct |= {name: seq_len for name in token_features}
    else:
        length_struct = {"tokens": seq_len, "out_idx": out_len, "targets": out_len}
    return grain.experimental.FirstFitPackIterDataset(
        ds,
        length_struct=length_struct,
        num_packing_bins=num_bins,
        seed=seed,
        shuffle_bins=shuffle_bins,
        # targets ride along with tokens / out_idx: packed and zero-padded, no ids of their own.
        meta_features=("targets", *token_features),
    )


def finalize_pt(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Packed PT batch -> contract. A row element's pairs never leave its segment, so the
    loss mask is simply "not padding"."""
    seg = batch["tokens_segment_ids"].astype(np.int32)
    extra = {k: v for k, v in batch.items() if k not in PT_KEYS and not k.startswith("tokens_")}
    return {
        "tokens": batch["tokens"].astype(np.int32),
        "positions": batch["tokens_positions"].astype(np.int32),
        "segment_ids": seg,
        "targets": batch["targets"].astype(np.int32),
        "loss_mask": (seg > 0).astype(np.float32),
    } | extra  # token_features (e.g. a mixture's source), for the iterator to take off


def segment_starts(segment_ids: np.ndarray) -> np.ndarray:
    """[B, S+1] array index where segment s of each row starts (segments are contiguous and
    in increasing order, padding 0 at the end). Column 0 is 0."""
    b = segment_ids.shape[0]
    n_seg = int(segment_ids.max(initial=0))
    counts = np.zeros((b, n_seg + 1), np.int64)
    rows = np.repeat(np.arange(b), segment_ids.shape[1])
    np.add.at(counts, (rows, segment_ids.reshape(-1)), 1)
    starts = np.zeros_like(counts)
    if n_seg:
        # start of s = tokens of segments 1..s-1 (padding, segment 0, comes last).
        starts[:, 2:] = np.cumsum(counts[:, 1:-1], axis=1)
    return starts


def finalize_sft(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Packed SFT batch -> contract: local out_idx become array indices into the row."""
    seg = batch["tokens_segment_ids"].astype(np.int32)
    out_seg = batch["out_idx_segment_ids"]
    starts = segment_starts(seg)
    rows = np.arange(seg.shape[0])[:, None]
    out_pos = np.where(out_seg > 0, starts[rows, out_seg] + batch["out_idx"], 0)
    return {
        "tokens": batch["tokens"].astype(np.int32),
        "positions": batch["tokens_positions"].astype(np.int32),
        "segment_ids": seg,
        "output_positions": out_pos.astype(np.int32),
        "targets": np.where(out_seg > 0, batch["targets"], 0).astype(np.int32),
        "loss_mask": (out_seg > 0).astype(np.float32),
    }


def finalize(kind: str, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return finalize_pt(batch) if kind == "pt" else finalize_sft(batch)


def pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Appends all-zero rows (segment 0, loss_mask 0: they count for nothing) up to `rows`."""
    have = next(iter(batch.values())).shape[0]
    if have >= rows:
        return batch
    return {
        k: np.concatenate([v, np.zeros((rows - have, *v.shape[1:]), v.dtype)])
        for k, v in batch.items()
    }
