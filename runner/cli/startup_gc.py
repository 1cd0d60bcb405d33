"""The cyclic garbage collector paused while the command starts, and what start-up made frozen after.

Importing torch and torchvision allocates about 600,000 objects that live as long as the process;
each full collection walks all of them and finds little to free, so importing torch alone spends
about 0.7 s of CPU in the collector, and every later full collection in the run about 0.15 s more
(measured on 2 cores; docs/explanation/performance.md). ``pause()`` turns the collector off for the
command line's checks and imports; ``resume()`` moves every object alive at that point into the
collector's permanent generation (``gc.freeze``), where later collections do not walk it, and turns
the collector back on for the jobs.

A single job's check leaves about 30,000 objects of cyclic garbage (composed configs; the model is
checked on the meta device, so no tensor memory): frozen with the rest, about 10 MB never freed,
where collecting them would cost 0.3 s. A sweep's check leaves garbage in proportion to its jobs
(26 MB for 16), so it is collected before the freeze.

Only ``python -m runner`` pauses (its ``__main__`` block): ``runner.__main__.main`` called in a
process of one's own (a notebook, a test) leaves that process's collector as it is.
"""
from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Collector off: start-up (imports, composing, checks) allocates without collections."""
    global _paused
    gc.disable()
    _paused = True


def resume(collect_first: bool) -> None:
    """After ``pause()``: everything start-up left alive stays out of later collections, and the collector
    runs again for the jobs; without a pause, nothing.

    ``collect_first``: free start-up's cyclic garbage before freezing (a sweep, whose garbage grows with its jobs).
    """
    global _paused
    if not _paused:
        return
    if collect_first:
        gc.collect()
    gc.freeze()
    gc.enable()
    _paused = False
