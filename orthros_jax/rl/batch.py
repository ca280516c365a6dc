"""GRPO's update batch in the SFT shape: prompt + completion pairs packed into rows, with
output copies only at the positions that predict a completion token.

A pair (prompt p [P], completion c [C]) is one packed document of P + C - 1 tokens (the last
completion token predicts nothing); position t = P - 1 + j predicts c[j], so the pair's C
output copies sit there. So an Orthros update runs its base stream (the window) over the
prompt and output copies over the completion alone, as SFT does (PAPER.md Sec. 3.2).

Batch arrays (the SFT contract of data/packing.py plus GRPO's per-copy terms):
  tokens, positions, segment_ids [R, T] int32
  output_positions, targets [R, T_out] int32; loss_mask [R, T_out] float32
  advantages, old_logprobs [R, T_out] float32 (the pair's advantage; the sampling log-prob)
  sequence [R, T_out] int32: the pair's index in the step (0 .. n-1; padding: n), for
    per-completion means (GSPO's ratio, the sequence normalisation)
"""

from __future__ import annotations

import dataclasses

import numpy as np

RL_KEYS: tuple[str, ...] = (
    "tokens",
    "positions",
    "segment_ids",
    "output_positions",
    "targets",
    "loss_mask",
    "advantages",
    "old_logprobs",
    "sequence",
)


@dataclasses.dataclass(frozen=True)
class Pair:
    """One sampled completion of a prompt: prompt [P] and completion [C] token ids (C >= 1),
    the completion's sampling log-probs [C] and its advantage."""

    prompt: np.ndarray
    completion: np.ndarray
    logprobs: np.ndarray
    advantage: float

    def __post_init__(self) -> None:
        if len(self.completion) < 1 or len(self.logprobs) != len(self.completion):
            raise ValueError("a Pair needs >= 1 completion token and one log-prob per token")


def group_advantages(rewards_NG: np.ndarray, scale: bool, eps: float = 1e-6) -> np.ndarray:
    """[N, G] rewards of N prompts' groups -> advantages: the reward minus its group's mean,
    divided by the group's std when `scale` (GRPO; Dr. GRPO leaves it out). A group whose
    rewards are all equal has advantage 0 (it carries no signal)."""
    r = np.asarray(rewards_NG, np.float64)
    a = r - r.mean(axis=1, keepdims=True)
    if scale:
        a = a / (r.std(axis=1, keepdims=True) + eps)
    return a.astype(np.float32)


def pack_pairs(pairs: list[Pair], rows: int, seq_len: int, out_len: int) -> dict[str, np.ndarray]:
    """First-fit packing of the pairs (in order) into `rows` rows of seq_len tokens and
    out_len output copies. Raises ValueError naming the sizes when a pair cannot fit a row or
    the pairs need more rows than the batch has."""
    b = {
        "tokens": np.zeros((rows, seq_len), np.int32),
        "positions": np.zeros((rows, seq_len), np.int32),
        "segment_ids": np.zeros((rows, seq_len), np.int32),
        "output_positions": np.zeros((rows, out_len), np.int32),
        "targets": np.zeros((rows, out_len), np.int32),
        "loss_mask": np.zeros((rows, out_len), np.float32),
        "advantages": np.zeros((rows, out_len), np.float32),
        "old_logprobs": np.zeros((rows, out_len), np.float32),
        "sequence": np.full((rows, out_len), len(pairs), np.int32),
    }
    used_t, used_o, segs = np.zeros(rows, int), np.zeros(rows, int), np.zeros(rows, int)
    for n, pair in enumerate(pairs):
        seq = np.concatenate([pair.prompt, pair.completion]).astype(np.int32)[:-1]
        t, c = len(seq), len(pair.completion)
        if t > seq_len or c > out_len:
            raise ValueError(
                f"pair {n} needs {t} tokens and {c} output copies; the update rows hold "
                f"grpo.seq_len={seq_len} and grpo.out_len={out_len}"
            )
        fit = np.nonzero((used_t + t <= seq_len) & (used_o + c <= out_len))[0]
        if len(fit) == 0:
            raise ValueError(
                f"{len(pairs)} pairs do not fit grpo.rows={rows} rows of {seq_len} tokens / "
                f"{out_len} outputs; raise grpo.rows (or seq_len / out_len)"
            )
        r, t0, o0 = fit[0], used_t[fit[0]], used_o[fit[0]]
        segs[r] += 1
        b["tokens"][r, t0 : t0 + t] = seq
        b["positions"][r, t0 : t0 + t] = np.arange(t)
        b["segment_ids"][r, t0 : t0 + t] = segs[r]
        out = slice(o0, o0 + c)
        b["output_positions"][r, out] = t0 + len(pair.prompt) - 1 + np.arange(c)
        b["targets"][r, out] = pair.completion
        b["loss_mask"][r, out] = 1.0
        b["advantages"][r, out] = pair.advantage
        b["old_logprobs"][r, out] = pair.logprobs
        b["sequence"][r, out] = n
        used_t[r], used_o[r] = t0 + t, o0 + c
    for r in range(rows):  # the padding after the pairs: segment 0, positions increasing
        b["positions"][r, used_t[r] :] = np.arange(seq_len - used_t[r])
    return b
