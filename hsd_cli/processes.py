"""What every process hsd starts shares: how it is started, that it dies with its parent, and
the memory left for more.

Nothing of hsd_cli is imported here.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import sys

SPAWN = multiprocessing.get_context("spawn")  # no forked torch/onnxruntime thread state
_PR_SET_PDEATHSIG = 1

# A worker killed for a page timeout leaves its draft processes' semaphores to multiprocessing's
# resource tracker, which removes them (its job) and then warns of them on the run's stderr. The
# tracker takes its warning filters from the process that starts it (the run's parent, importing
# this before any process starts).
_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"
if _QUIET_TRACKER not in sys.warnoptions:
    sys.warnoptions.append(_QUIET_TRACKER)


def die_with_parent() -> None:
    """Linux: the kernel kills this process when the parent's thread that started it ends, or the
    whole parent dies, even by SIGKILL. Whoever starts a process keeps its starting thread alive
    as long as the process should live."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


def available_memory() -> int | None:
    """Linux: the memory available to new processes (MemAvailable), in bytes; None where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
