"""Preemption: SIGTERM (a TPU / cloud GPU eviction notice) or SIGINT (Ctrl-C) during training
asks the loop to finish the current optimizer update, write a checkpoint and return.

    with PreemptionWatcher() as watcher:
        ...
        if watcher.reached(update):   # at every update boundary, on every process
            save and stop

One process: Python signal handlers set a flag that `reached` reads. Several processes (jax
.distributed initialised): every process must stop at the same update, so the signal is handed
to JAX's preemption sync manager (jax_enable_preemption_service, on by default), whose notice
reaches all processes and which picks the first update every process can still reach
(multihost_utils.reached_preemption_sync_point; what orbax's reached_preemption wraps). Its
SIGTERM handler is native, so only SIGINT gets a Python handler there, which re-sends itself
as SIGTERM. Without the sync manager the processes agree through an allgather of their flags
at each update boundary (host-blocking, hence only as the fallback). A second signal before
the checkpoint is written stops at once (the default action).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType, TracebackType
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _uses_sync_manager() -> bool:
    """Several processes under jax.distributed with JAX's preemption service on."""
    return (
        jax.process_count() > 1
        and jax.distributed.is_initialized()
        and bool(jax.config.values["jax_enable_preemption_service"])
    )


class PreemptionWatcher:
    """Installs the handlers on enter (main thread only; elsewhere it watches nothing) and
    restores the previous ones on exit. `signal_name` is the signal that asked to stop."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._sync = False

    def __enter__(self) -> PreemptionWatcher:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        self._sync = _uses_sync_manager()
        handled = (signal.SIGINT,) if self._sync else SIGNALS
        for sig in handled:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:  # the second one: stop now
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            os.kill(os.getpid(), signum)
            return
        self.signal_name = name
        sys.stderr.write(
            f"received {name}: finishing the current update, then writing a checkpoint "
            f"(send {name} again to stop at once)\n"
        )
        sys.stderr.flush()
        if self._sync:  # SIGINT under the sync manager: its notice is SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)

    def reached(self, update: int) -> bool:
        """Whether to checkpoint and stop after `update` (every process gets the same answer
        when every process calls it at every update)."""
        if self._sync:
            if multihost_utils.reached_preemption_sync_point(update):
                self.signal_name = self.signal_name or "SIGTERM"
                return True
            return False
        local = self.signal_name is not None
        if jax.process_count() == 1:
            return local
        flags = multihost_utils.process_allgather(np.int32(local))
        if np.any(flags) and not local:
            self.signal_name = "a preemption signal on another process"
        return bool(np.any(flags))
