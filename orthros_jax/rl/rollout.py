"""Rollouts from the serving engine, in process: a group of sampled completions per prompt.

The same `serving.Engine` that serves HTTP (slots, chunked prefill, per-row sampling with seeds,
prefix caching: the group of a prompt shares its prefix) is stepped here on the caller's
thread. `Engine.set_params` swaps in the policy's new parameters after every update: same
shapes and shardings, so nothing recompiles. Each sampled token comes back with its log-prob
under the distribution it was drawn from (softmax(logits / temperature)), which is the old
policy's: the update needs no second pass for it.

Seeds are a pure function of (run seed, step, prompt, sample), so a resumed run draws the same
completions from the same parameters.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import numpy as np

from orthros_jax.rl.tasks import Prompt
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.events import Event
from orthros_jax.serving.requests import SamplingParams


@dataclasses.dataclass
class Sample:
    """One completion: tokens [C] (the stop token included when one ended it), their sampling
    log-probs [C], why it ended, and its text (stop token excluded)."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None

    def __call__(self, event: Event) -> None:
        if event.kind == "token":
            assert event.token is not None and event.sample_logprob is not None
            self.tokens.append(event.token)
            self.logprobs.append(event.sample_logprob)
            self.text += event.text
        elif event.kind == "done":
            self.text += event.text
            self.finish_reason = event.finish_reason
            if event.token is not None:  # the stop token the engine does not stream
                assert event.sample_logprob is not None
                self.tokens.append(event.token)
                self.logprobs.append(event.sample_logprob)
        else:
            self.error = event.error


@dataclasses.dataclass(frozen=True)
class Rollout:
    """samples[i][j]: prompt i's j-th completion; seconds of engine time; engine steps."""

    samples: list[list[Sample]]
    seconds: float
    engine_steps: int

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.tokens) for group in self.samples for s in group)


def sample_seed(seed: int, step: int, prompt: int, sample: int) -> int:
    """The uint32 seed of one completion: a pure function of where it is in the run."""
    return int(np.random.default_rng([seed, step, prompt, sample]).integers(2**32))


def rollout(
    engine: Engine,
    prompts: list[Prompt],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    step: int,
) -> Rollout:
    """group_size completions of every prompt, sampled by the engine (temperature 0: greedy,
    one per prompt is enough but group_size are returned). Raises RuntimeError when a request
    fails in the engine. The engine must not be running its own thread."""
    if engine.running:
        raise ValueError("rollout steps the engine itself; do not start() it")
    start, steps0 = time.perf_counter(), engine.steps
    samples = [[Sample() for _ in range(group_size)] for _ in prompts]
    pending = collections.deque(
        (i, j, p.ids.tolist()) for i, p in enumerate(prompts) for j in range(group_size)
    )
    while pending or engine.busy():
        # Submit no more than the engine's queue holds (it refuses the rest: HTTP 429); the
        # others wait for slots. Seeds are per request, so the order changes no completion.
        while pending and len(engine.queue) < engine.max_queue:
            i, j, ids = pending.popleft()
            params = SamplingParams(
                max_tokens=max_new_tokens,
                temperature=temperature,
                seed=sample_seed(seed, step, i, j),
                logprobs=None,
            )
            engine.submit(ids, params, samples[i][j])
        engine.step()
    for i, group in enumerate(samples):
        for j, s in enumerate(group):
            if s.error is not None or s.finish_reason is None:
                raise RuntimeError(f"rollout of prompt {i} sample {j} failed: {s.error}")
    return Rollout(samples, time.perf_counter() - start, engine.steps - steps0)
