"""The continuous-batching engine: a fixed set of slots (rows of one KVCache), a bounded queue,
and a loop that admits, prefills in chunks, decodes and frees.

One engine step (Engine.step):
  1. frees the slots of cancelled requests and admits waiting ones into free slots, oldest
     first (with prefix_caching, into the row holding their longest cached prefix: prefix.py);
  2. prefills up to `chunk_budget` prompt tokens over the slots still prefilling, oldest first
     (one device.prefill_rows call into those rows only; a new request's row is reset in it);
  3. runs `decode_steps` decode steps for every generating slot (one device.decode_rows call);
  4. reads the sampled tokens back and, per slot, streams the text, applies the stops (stop
     strings, stop / end-of-text ids, max_tokens, the row's capacity) and frees finished slots.
Shapes are bucketed: the prefill takes [P, T] for P in `prefill_batches` and T in
`prefill_lengths`, the decode [B]; `warmup()` compiles every bucket once, so the steady state
never compiles (tests/test_serving_engine.py counts it). The cache is donated to every call.
With mesh= (a sequence-split cache) the two calls run sequence-parallel. A failure in one request
fails it alone; a failed device call fails the requests in it and restarts the cache.
`start()` runs the loop on a thread; `shutdown(drain=True)` finishes the running ones and stops.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from orthros_jax.config import ModelConfig
from orthros_jax.inference import Speculative, init_cache
from orthros_jax.inference import logit_processing as lp
from orthros_jax.inference.cache import KVCache
from orthros_jax.inference.sampling import Sampled
from orthros_jax.model import Params
from orthros_jax.serving import buckets, device, row_inputs
from orthros_jax.serving.events import Event, Request, Slot
from orthros_jax.serving.metrics import Metrics
from orthros_jax.serving.prefix import PrefixIndex
from orthros_jax.serving.requests import RequestError, SamplingParams, check_request
from orthros_jax.serving.text import TextStream

log = logging.getLogger(__name__)


class Engine:
    """params: the model's params (host or device); cfg its ModelConfig. max_batch slots of
    max_len cache positions each; chunk_budget prompt tokens per step (default
    cfg.prefill_chunk); max_queue waiting requests before submit raises (HTTP 429).
    decode_text: the tokenizer's decode (ids -> text; default: none, text stays empty);
    eos_id: the end-of-text id (stops a request unless ignore_eos). batch_wait_s: how long an
    idle engine lets a burst of arrivals gather before its first step (until every slot has a
    request or the time is up), so requests sent together prefill in one call. mesh: a mesh with
    a "sequence" axis > 1 (parallel.mesh.sequence_mesh) splits every row's slots over it and its
    calls run sequence-parallel (buckets.check_mesh says what it refuses); None: one device.
    kv_cache_dtype: "int8" / "fp8" keep the cache's K/V quantized (init_cache's).
    prefix_caching: admit a request with the longest prompt prefix a row holds (prefix.py).
    speculative: each decode step is a speculative round, <= k + 1 tokens (docs/speculative.md)."""

    cache: KVCache  # donated to every call
    hist: lp.History  # the penalties' token history, a row per cache row

    def __init__(
        self,
        params: Params,
        cfg: ModelConfig,
        *,
        max_batch: int = 4,
        max_len: int = 2048,
        chunk_budget: int | None = None,
        max_queue: int = 64,
        decode_text: Callable[[list[int]], str] | None = None,
        eos_id: int | None = None,
        prefill_lengths: tuple[int, ...] | None = None,
        prefill_batches: tuple[int, ...] | None = None,
        seed: int = 0,
        metrics: Metrics | None = None,
        decode_steps: int = 1,
        batch_wait_s: float = 0.0,
        mesh: Mesh | None = None,
        kv_cache_dtype: str | None = None,
        prefix_caching: bool = False,
        speculative: Speculative | None = None,
    ) -> None:
        chunk_budget = cfg.prefill_chunk if chunk_budget is None else chunk_budget
        buckets.check_engine(
            cfg,
            mesh,
            max_batch=max_batch,
            max_len=max_len,
            chunk_budget=chunk_budget,
            max_queue=max_queue,
            decode_steps=decode_steps,
            batch_wait_s=batch_wait_s,
            prefix_caching=prefix_caching,
            speculative=speculative,
        )  # first: a refusal compiles nothing
        self.cfg, self.max_batch, self.max_len, self.mesh = cfg, max_batch, max_len, mesh
        self._dev: Any = device  # the device calls (a test may wrap them)
        self.decode_steps, self.speculative = decode_steps, speculative
        self.batch_wait_s = float(batch_wait_s)
        self.chunk_budget, self.max_queue = chunk_budget, max_queue
        self.prefill_lengths, self.prefill_batches = buckets.prefill_buckets(
            cfg, chunk_budget, max_batch, prefill_lengths, prefill_batches
        )
        self.max_chunk = min(self.prefill_lengths[-1], chunk_budget)
        self.decode_text = decode_text or (lambda ids: "")
        self.eos_id = eos_id
        self.metrics = metrics or Metrics()
        self.params = jax.device_put(params, device.replicated(mesh))
        self.kv_cache_dtype = kv_cache_dtype
        self._fresh()
        self.prefix = PrefixIndex(cfg, max_batch) if prefix_caching else None
        self.slots: list[Slot | None] = [None] * max_batch
        self.queue: collections.deque[Request] = collections.deque()
        self._cond = threading.Condition()
        self._rng = np.random.default_rng(seed)
        self._closed = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0

    # ------------------------------------------------------------ client side (any thread)

    def submit(
        self, ids: list[int], params: SamplingParams, on_event: Callable[[Event], object]
    ) -> Request:
        """Queues a request (ids: a valid, non-empty prompt; see requests.prompt_ids). Raises
        RequestError 429 when the queue is full, 503 when the engine is shutting down."""
        check_request(ids, params, self.max_len)
        with self._cond:
            if self._closed:
                self.metrics.rejected("shutting_down")
                raise RequestError("the server is shutting down", None, status=503)
            if len(self.queue) >= self.max_queue:
                self.metrics.rejected("queue_full")
                raise RequestError(
                    f"the queue is full ({self.max_queue} waiting requests); retry later",
                    None,
                    status=429,
                )
            seed = params.seed if params.seed is not None else int(self._rng.integers(2**32))
            req = Request(ids, params, on_event, seed)
            self.queue.append(req)
            self._publish_load()
            self._cond.notify_all()
        return req

    def set_params(self, params: Params) -> None:
        """Swaps in new parameters of the same shapes and dtypes (e.g. the policy after an RL
        update): placed like the old ones, so no call recompiles. Only between steps."""
        old = jax.tree.map(lambda a: (a.shape, a.dtype), self.params)
        new = jax.tree.map(lambda a: (a.shape, a.dtype), params)
        if old != new:
            raise ValueError("Engine.set_params: new params differ in structure, shape or dtype")
        self.params = jax.device_put(params, device.replicated(self.mesh))
        if self.prefix is not None:  # the rows' K/V and states are the old parameters'
            self.prefix.clear()

    def cancel(self, req: Request) -> None:
        with self._cond:
            req.cancelled = True
            self._cond.notify_all()

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Refuses new requests; with drain, lets queued and running ones finish; then stops."""
        with self._cond:
            self._closed = True
            for req in () if drain else [*self.queue, *(s.req for s in self.slots if s)]:
                req.cancelled = True
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        """True once shutdown began: new requests are refused."""
        return self._closed

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def busy(self) -> bool:
        return bool(self.queue) or any(s is not None for s in self.slots)

    # ------------------------------------------------------------ the loop (engine thread)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self.busy() and not self._stop:
                    self._cond.wait()
                if self._stop and not self.busy():
                    return
                if self.batch_wait_s and not any(self.slots):  # idle: let a burst gather
                    end = time.perf_counter() + self.batch_wait_s
                    while len(self.queue) < self.max_batch and not self._stop:
                        if not self._cond.wait(max(0.0, end - time.perf_counter())):
                            break
            try:
                self.step()
            except Exception:  # never leave the thread: fail what was running, go on
                log.exception("engine step failed")
                self._fail_all("internal error in the engine step")

    def warmup(self) -> None:
        """Compiles the decode and every prefill bucket on the live cache with no-op inputs (all
        rows padding / inactive), so serving never compiles."""
        for p in self.prefill_batches:
            for t in self.prefill_lengths:
                self._prefill_call(row_inputs.prefill_args(p, t, self.max_batch, []))
        self._decode_call(row_inputs.decode_args(self.max_batch, []))
        jax.block_until_ready((self.cache, self.hist))

    def step(self) -> None:
        """One engine step (see the module docstring)."""
        with self._cond:
            self._free_cancelled()
            self._admit()
            self._publish_load()
        chunks = row_inputs.plan_prefill(
            self.slots, self.chunk_budget, self.prefill_batches[-1], self.max_chunk
        )
        decoding = [i for i, s in enumerate(self.slots) if s is not None and s.decoding]
        pre = dec = None
        try:
            if chunks:
                pre = self._run_prefill(chunks)
            if decoding:
                dec = self._run_decode(decoding)
            pre, dec = jax.device_get((pre, dec))
        except Exception:
            log.exception("device call failed")
            self._fail_all("internal error in a model call")
            return
        now = time.perf_counter()
        if pre is not None:
            for j, (i, n) in enumerate(chunks):
                slot = self._held(i)
                if self.prefix is not None:
                    self.prefix.append(i, slot.req.ids[slot.prefilled : slot.prefilled + n])
                slot.prefilled += n
                if slot.decoding:  # its last chunk: the first token
                    self._guard(i, functools.partial(self._accept, slot, pre, j, now))
        if dec is not None:
            sampled, fed = dec
            owners = {i: self._held(i) for i in decoding}
            if self.prefix is not None:
                self.prefix.record_decode({i: s.last for i, s in owners.items()}, sampled, fed)
            for k in range(fed.shape[0]):
                step_k = jax.tree.map(lambda a, k=k: a[k], sampled)
                for i, slot in owners.items():
                    if fed[k, i] and self.slots[i] is slot:  # not finished by an earlier token
                        self._guard(i, functools.partial(self._accept, slot, step_k, i, now))
        self.steps += 1
        with self._cond:
            self._publish_load()

    # ------------------------------------------------------------ pieces of a step

    def _free_cancelled(self) -> None:
        for r in [r for r in self.queue if r.cancelled]:
            self.metrics.finished("cancelled", len(r.ids), None, None)
        self.queue = collections.deque(r for r in self.queue if not r.cancelled)
        for i, s in enumerate(self.slots):
            if s is not None and s.req.cancelled:
                self._finish(i, "cancelled")

    def _admit(self) -> None:
        free = [i for i in range(self.max_batch) if self.slots[i] is None]
        while free and self.queue:
            req = self.queue.popleft()
            i, reused = free[0], 0
            if self.prefix is not None:  # the row, with the longest prefix held copied in
                i, reused, self.cache, self.hist = self.prefix.admit(
                    req.ids, free, self.cache, self.hist, self.cfg
                )
                self.metrics.prefix(reused)
            free.remove(i)
            self.slots[i] = Slot.of(
                req, TextStream(self.decode_text, req.params.stop), self.eos_id, reused
            )

    def _held(self, i: int) -> Slot:
        slot = self.slots[i]
        assert slot is not None, f"slot {i} is free"
        return slot

    def _fresh(self) -> None:
        """An empty cache and penalty history."""
        self.cache = init_cache(
            self.cfg,
            self.max_batch,
            self.max_len,
            mesh=self.mesh,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        hist = lp.init_history(self.max_batch, self.cfg.vocab_size)
        self.hist = jax.device_put(hist, device.replicated(self.mesh))

    def _run_prefill(self, chunks: list[tuple[int, int]]) -> Sampled:
        p = buckets.fit(self.prefill_batches, len(chunks))
        t = buckets.fit(self.prefill_lengths, max(n for _, n in chunks))
        args = row_inputs.prefill_args(
            p, t, self.max_batch, [(i, self._held(i), n) for i, n in chunks]
        )
        return self._prefill_call(args)

    def _run_decode(self, decoding: list[int]) -> tuple[Sampled, jax.Array]:
        """decode_steps steps for the decoding slots: each runs while it has max_tokens and
        cache slots left and has not sampled a stop id (stop strings are the host's)."""
        rows = []
        for i in decoding:
            s = self._held(i)
            in_cache = len(s.req.ids) + s.generated - 1  # s.last is not fed yet
            left = min(s.req.params.max_tokens - s.generated, self.max_len - in_cache)
            rows.append((i, s, left))  # the call runs decode_steps steps (rounds) at most
        return self._decode_call(row_inputs.decode_args(self.max_batch, rows))

    def _prefill_call(self, args: tuple) -> Sampled:
        """device.prefill_rows on the live cache and history (row_inputs.prefill_args)."""
        sampled, self.cache, self.hist = self._dev.prefill_rows(
            self.params, self.cache, self.hist, *args, cfg=self.cfg, mesh=self.mesh
        )
        return sampled

    def _decode_call(self, args: tuple) -> tuple[Sampled, jax.Array]:
        """device.decode_rows (speculative: spec_decode_rows) on the live cache and history."""
        call, kw = self._dev.decode_rows, dict[str, Any](mesh=self.mesh)
        if self.speculative is not None:
            call, kw = self._dev.spec_decode_rows, dict(spec=self.speculative)
        sampled, fed, self.cache, self.hist, *stats = call(
            self.params, self.cache, self.hist, *args, cfg=self.cfg, steps=self.decode_steps, **kw
        )
        if stats:  # SpecStats (rounds, drafted, accepted) and the tokens emitted
            self.metrics.speculation(*(int(x.sum()) for x in (*jax.tree.leaves(stats), fed)))
        return sampled, fed

    def _accept(self, slot: Slot, sampled: Sampled, j: int, now: float) -> None:
        """Slot's token from row j of a sampled batch: stream it, then stop or go on."""
        req, p = slot.req, slot.req.params
        tok = int(sampled.tokens[j])
        slot.generated += 1
        if req.first_token_at is None:
            req.first_token_at = now
        self.metrics.tokens(1)
        if tok in slot.stop_ids:
            stop = (tok, float(sampled.sample_logprob[j]))
            return self._finish(self.slots.index(slot), "stop", stop=stop)
        req.on_event(slot.token_event(tok, sampled, j))
        in_cache = len(req.ids) + slot.generated - 1  # the new token is not fed yet
        if slot.text.stopped:
            self._finish(self.slots.index(slot), "stop")
        elif slot.generated >= p.max_tokens or in_cache >= self.max_len:
            self._finish(self.slots.index(slot), "length")
        else:
            slot.last = tok

    def _guard(self, i: int, fn: Callable[[], object]) -> None:
        """Runs one request's host work; an exception fails that request alone."""
        try:
            fn()
        except Exception as e:
            log.exception("request in slot %d failed", i)
            self._finish(i, "error", error=f"{type(e).__name__}: {e}")

    def _finish(
        self, i: int, reason: str, error: str | None = None, stop: tuple[int, float] | None = None
    ) -> None:
        slot = self.slots[i]
        if slot is None:
            return
        self.slots[i] = None
        self.metrics.finished(reason, len(slot.req.ids), *slot.timings())
        try:
            slot.req.on_event(slot.final_event(reason, error, stop))
        except Exception:
            log.exception("request in slot %d failed while finishing", i)

    def _fail_all(self, message: str) -> None:
        """After a failed device call: every running request fails, the cache restarts."""
        for i in range(self.max_batch):
            self._finish(i, "error", error=message)
        self._fresh()
        if self.prefix is not None:
            self.prefix.clear()

    def _publish_load(self) -> None:
        self.metrics.set_load(len(self.queue), sum(s is not None for s in self.slots))
