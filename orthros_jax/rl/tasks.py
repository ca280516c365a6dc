"""Verifiable tasks for RL: prompts with a known answer, and the reward that checks it.

A task is a `Task`: `prompt(seed, stream, index)` is a pure function of its arguments (so a
resumed run draws the same prompts) returning a `Prompt` (token ids and the answer text).
A reward is a `Reward`: `(completion_text, answer) -> float`. Tasks and rewards are plug-ins:
TASKS maps a name to a factory `(TaskConfig, Tokenizer) -> Task`; a new task is one class and
one line there.

Shipped (all offline, any tokenizer; with bytes every prompt is ASCII):
  passkey     data/recall.py's needle in filler, asked at the end; reward: exact match of
              the key at the completion's start (1 or 0).
  mqar        data/recall.py's key=value pairs in filler, one key queried at the end; reward:
              exact match of the value at the completion's start.
  arithmetic  "Q: 37+58= A: " with operands of `digits` digits (sum or difference); reward:
              1 when the completion starts with the right integer (parsed with a regex, so
              "95 and more" is right and "9" or "095x" is not), else 0.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Protocol

import numpy as np

from orthros_jax.data.recall import RecallTask
from orthros_jax.data.tokenizers import Tokenizer
from orthros_jax.rl.config import TaskConfig

TRAIN_STREAM, EVAL_STREAM = 0, 1


@dataclasses.dataclass(frozen=True)
class Prompt:
    """ids [P] int32 (the prompt's tokens) and the answer text its reward checks against."""

    ids: np.ndarray
    answer: str


class Reward(Protocol):
    def __call__(self, completion: str, answer: str) -> float:
        """The reward of one completion's text for a prompt whose answer is `answer`."""
        ...


class Task(Protocol):
    @property
    def reward(self) -> Reward: ...

    def prompt(self, seed: int, stream: int, index: int) -> Prompt:
        """Prompt `index` of a seed's stream (TRAIN_STREAM / EVAL_STREAM): a pure function."""
        ...


class RewardError(RuntimeError):
    """A reward function raised or returned a non-number; names the example."""


def exact_prefix(completion: str, answer: str) -> float:
    """1.0 when the completion starts with the answer exactly, else 0.0."""
    return float(completion.startswith(answer))


_INT = re.compile(r"\s*(-?\d+)(?!\d)")


def integer_answer(completion: str, answer: str) -> float:
    """1.0 when the completion's leading integer (after optional spaces) equals the answer."""
    m = _INT.match(completion)
    return float(m is not None and int(m.group(1)) == int(answer))


class RecallPrompts:
    """passkey / mqar prompts: the example up to its (last) answer; the answer's text."""

    def __init__(self, cfg: TaskConfig, tok: Tokenizer) -> None:
        self.tok = tok
        self.task = RecallTask(
            tok,
            cfg.name,
            context_len=cfg.context_len,
            n_pairs=cfg.pairs,
            n_queries=cfg.queries,
            gap=cfg.gap,
            filler=cfg.filler,
            passkey_digits=cfg.digits,
        )

    @property
    def reward(self) -> Reward:
        return exact_prefix

    def prompt(self, seed: int, stream: int, index: int) -> Prompt:
        ex = self.task.sample(seed, index, stream)
        return Prompt(ex.prompt.astype(np.int32), self.tok.decode(ex.answer.tolist()))


class ArithmeticPrompts:
    """ "Q: a+b= A: " or "Q: a-b= A: " with a, b of `digits` digits; the answer its value."""

    def __init__(self, cfg: TaskConfig, tok: Tokenizer) -> None:
        self.tok, self.digits = tok, cfg.digits

    @property
    def reward(self) -> Reward:
        return integer_answer

    def prompt(self, seed: int, stream: int, index: int) -> Prompt:
        rng = np.random.default_rng([seed, stream, index])
        lo, hi = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits
        a, b = (int(x) for x in rng.integers(lo, hi, 2))
        op = "+" if rng.integers(2) == 0 else "-"
        value = a + b if op == "+" else a - b
        ids = np.asarray(self.tok.encode(f"Q: {a}{op}{b}= A: "), np.int32)
        return Prompt(ids, str(value))


TASKS: dict[str, Callable[[TaskConfig, Tokenizer], Task]] = {
    "passkey": RecallPrompts,
    "mqar": RecallPrompts,
    "arithmetic": ArithmeticPrompts,
}


def make_task(cfg: TaskConfig, tok: Tokenizer) -> Task:
    """The task a config names (ValueError naming task.name when unknown)."""
    if cfg.name not in TASKS:
        raise ValueError(f"task.name={cfg.name!r} is unknown; allowed: {', '.join(TASKS)}")
    return TASKS[cfg.name](cfg, tok)


def score(reward: Reward, completions: list[str], answers: list[str]) -> np.ndarray:
    """[n] float32 rewards; a reward that raises or returns a non-finite non-number stops the
    run with a RewardError naming the example (its index, answer and completion)."""
    out = np.zeros(len(completions), np.float32)
    for i, (text, answer) in enumerate(zip(completions, answers, strict=True)):
        try:
            r = reward(text, answer)
        except Exception as e:  # a user's plug-in: any failure names the example
            raise RewardError(
                f"reward {getattr(reward, '__name__', reward)!r} raised on example {i} "
                f"(answer {answer!r}, completion {text!r}): {type(e).__name__}: {e}"
            ) from e
        if (
            isinstance(r, bool)
            or not isinstance(r, int | float | np.number)
            or not math.isfinite(r)
        ):
            raise RewardError(
                f"reward {getattr(reward, '__name__', reward)!r} returned {r!r} on example {i} "
                f"(answer {answer!r}, completion {text!r}); it must return a finite number"
            )
        out[i] = r
    return out
