"""Serving metrics in the Prometheus text format (version 0.0.4), kept by hand: gauges for the
queue depth and active slots, counters for requests and tokens, a tokens/s rate over a sliding
window, and histograms of the time to first token and the per-token latency."""

from __future__ import annotations

import bisect
import collections
import threading
import time

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
RATE_WINDOW_S = 10.0


class Histogram:
    """Cumulative-bucket histogram of seconds."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.total, self.n = bounds, [0] * len(bounds), 0.0, 0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.bounds, seconds)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += seconds
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out += [
            f'{name}_bucket{{le="+Inf"}} {self.n}',
            f"{name}_sum {self.total}",
            f"{name}_count {self.n}",
        ]
        return out


class Metrics:
    """Thread-safe: the engine thread records, the HTTP handlers read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queue_depth = 0
        self.active_slots = 0
        self.requests: collections.Counter[str] = collections.Counter()  # by outcome
        self.generated = 0
        self.prompt_tokens = 0
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.prefix_lookups = self.prefix_hits = self.prefix_reused = 0
        self.spec_rounds = self.spec_drafted = self.spec_accepted = self.spec_emitted = 0

    def set_load(self, queue_depth: int, active_slots: int) -> None:
        with self._lock:
            self.queue_depth, self.active_slots = queue_depth, active_slots

    def tokens(self, n: int, now: float | None = None) -> None:
        with self._lock:
            self.generated += n
            self._recent.append((time.monotonic() if now is None else now, n))

    def finished(
        self, outcome: str, prompt_tokens: int, ttft_s: float | None, tpot_s: float | None
    ) -> None:
        with self._lock:
            self.requests[outcome] += 1
            self.prompt_tokens += prompt_tokens
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            if tpot_s is not None:
                self.tpot.observe(tpot_s)

    def prefix(self, reused_tokens: int) -> None:
        """A request admitted with prefix caching on, reusing this many cached prompt tokens."""
        with self._lock:
            self.prefix_lookups += 1
            self.prefix_hits += reused_tokens > 0
            self.prefix_reused += reused_tokens

    def speculation(self, rounds: int, drafted: int, accepted: int, emitted: int) -> None:
        """A speculative decode call: row-rounds (verify passes), drafts proposed, drafts
        accepted, tokens emitted (accepted + one per round, less what a stop cut)."""
        with self._lock:
            self.spec_rounds += rounds
            self.spec_drafted += drafted
            self.spec_accepted += accepted
            self.spec_emitted += emitted

    def speculation_rates(self) -> tuple[float, float, float]:
        """(acceptance rate: accepted / drafted, mean accepted length: accepted drafts per
        round, tokens per verify: emitted / rounds); 0 before any round."""
        with self._lock:
            r, d = self.spec_rounds, self.spec_drafted
            return (
                self.spec_accepted / d if d else 0.0,
                self.spec_accepted / r if r else 0.0,
                self.spec_emitted / r if r else 0.0,
            )

    def rejected(self, reason: str) -> None:
        with self._lock:
            self.requests[reason] += 1

    def tokens_per_second(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / RATE_WINDOW_S

    def render(self) -> str:
        """The /metrics page."""
        rate = self.tokens_per_second()
        acceptance, accepted_len, per_verify = self.speculation_rates()
        p = "orthros"
        with self._lock:
            lines = [
                f"# HELP {p}_queue_depth Requests waiting for a slot.",
                f"# TYPE {p}_queue_depth gauge",
                f"{p}_queue_depth {self.queue_depth}",
                f"# HELP {p}_active_slots Slots holding a request.",
                f"# TYPE {p}_active_slots gauge",
                f"{p}_active_slots {self.active_slots}",
                f"# HELP {p}_tokens_per_second Generated tokens per second "
                f"over the last {RATE_WINDOW_S:g} s.",
                f"# TYPE {p}_tokens_per_second gauge",
                f"{p}_tokens_per_second {rate}",
                f"# HELP {p}_generated_tokens_total Tokens generated.",
                f"# TYPE {p}_generated_tokens_total counter",
                f"{p}_generated_tokens_total {self.generated}",
                f"# HELP {p}_prompt_tokens_total Prompt tokens of finished requests.",
                f"# TYPE {p}_prompt_tokens_total counter",
                f"{p}_prompt_tokens_total {self.prompt_tokens}",
                f"# HELP {p}_requests_total Requests by outcome.",
                f"# TYPE {p}_requests_total counter",
            ]
            lines += [
                f'{p}_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(self.requests.items())
            ]
            hit_rate = self.prefix_hits / self.prefix_lookups if self.prefix_lookups else 0.0
            lines += [
                f"# HELP {p}_prefix_cache_hit_rate Admitted requests that reused a cached prefix.",
                f"# TYPE {p}_prefix_cache_hit_rate gauge",
                f"{p}_prefix_cache_hit_rate {hit_rate}",
                f"# HELP {p}_prefix_cache_queries_total Requests admitted with prefix caching on.",
                f"# TYPE {p}_prefix_cache_queries_total counter",
                f"{p}_prefix_cache_queries_total {self.prefix_lookups}",
                f"# HELP {p}_prefix_cache_reused_tokens_total Prompt tokens not prefilled: reused.",
                f"# TYPE {p}_prefix_cache_reused_tokens_total counter",
                f"{p}_prefix_cache_reused_tokens_total {self.prefix_reused}",
            ]
            lines += [
                f"# HELP {p}_spec_acceptance_rate Speculative drafts accepted / drafted.",
                f"# TYPE {p}_spec_acceptance_rate gauge",
                f"{p}_spec_acceptance_rate {acceptance}",
                f"# HELP {p}_spec_mean_accepted_length Accepted drafts per verify pass.",
                f"# TYPE {p}_spec_mean_accepted_length gauge",
                f"{p}_spec_mean_accepted_length {accepted_len}",
                f"# HELP {p}_spec_tokens_per_verify Tokens emitted per verify pass.",
                f"# TYPE {p}_spec_tokens_per_verify gauge",
                f"{p}_spec_tokens_per_verify {per_verify}",
                f"# HELP {p}_spec_rounds_total Verify passes (row-rounds).",
                f"# TYPE {p}_spec_rounds_total counter",
                f"{p}_spec_rounds_total {self.spec_rounds}",
                f"# HELP {p}_spec_drafted_tokens_total Draft tokens proposed.",
                f"# TYPE {p}_spec_drafted_tokens_total counter",
                f"{p}_spec_drafted_tokens_total {self.spec_drafted}",
                f"# HELP {p}_spec_accepted_tokens_total Draft tokens accepted.",
                f"# TYPE {p}_spec_accepted_tokens_total counter",
                f"{p}_spec_accepted_tokens_total {self.spec_accepted}",
            ]
            lines += [
                f"# HELP {p}_time_to_first_token_seconds Arrival to first token.",
                f"# TYPE {p}_time_to_first_token_seconds histogram",
                *self.ttft.lines(f"{p}_time_to_first_token_seconds"),
                f"# HELP {p}_time_per_output_token_seconds Mean gap between a request's tokens.",
                f"# TYPE {p}_time_per_output_token_seconds histogram",
                *self.tpot.lines(f"{p}_time_per_output_token_seconds"),
            ]
        return "\n".join(lines) + "\n"
