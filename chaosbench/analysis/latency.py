"""The latency histogram of a serving run's load windows: its bucket edges and the arithmetic on it, in one home
that both the load process (:mod:`chaosbench.workloads.serve_load`, which counts into it) and the analysis
(:mod:`chaosbench.analysis.serving`, which merges it) import. Standard-library only and free of chaosbench
imports, so importing it costs nothing and closes no import cycle.

A ``latency_hist`` has ``len(LATENCY_EDGES_MS) + 1`` counts: bucket 0 counts latencies below the first edge,
bucket ``i`` those with ``LATENCY_EDGES_MS[i-1] <= latency < LATENCY_EDGES_MS[i]``, the last those at or above the
last edge (:func:`latency_bucket`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

#: Bucket edges in milliseconds: 20 per decade (each bucket 12 % wide) from 1 ms to 31.6 s.
LATENCY_EDGES_MS: tuple[float, ...] = tuple(round(10 ** (k / 20), 4) for k in range(91))
#: Counts in a ``latency_hist``.
LATENCY_BUCKETS = len(LATENCY_EDGES_MS) + 1


def latency_bucket(latency_ms: float, edges_ms: Sequence[float] = LATENCY_EDGES_MS) -> int:
    """The ``latency_hist`` index of a latency in milliseconds."""
    return bisect.bisect_right(edges_ms, latency_ms)


def merge_hists(hists: Iterable[Sequence[int]], buckets: int = LATENCY_BUCKETS) -> list[int]:
    """Bucket-wise sum of histograms of ``buckets`` counts."""
    out = [0] * buckets
    for h in hists:
        for i, c in enumerate(h):
            out[i] += int(c)
    return out


def quantile_ms(
    hist: Sequence[int], q: float, max_ms: float | None = None, edges_ms: Sequence[float] = LATENCY_EDGES_MS
) -> float | None:
    """The ``q``-quantile (0..1) of the latencies counted in ``hist``, in ms: the bucket holding rank
    ``q x total`` and, within it, linear interpolation between its edges (bucket 0 starts at 0). In the last,
    unbounded bucket: ``max_ms`` (the largest latency seen) when given, else the last edge. None for an empty
    histogram."""
    total = sum(hist)
    if total <= 0:
        return None
    rank = q * total
    before = 0
    for i, count in enumerate(hist):
        if count <= 0:
            continue
        if before + count >= rank:
            if i >= len(edges_ms):
                return float(max_ms) if max_ms is not None else float(edges_ms[-1])
            lo = edges_ms[i - 1] if i > 0 else 0.0
            hi = edges_ms[i]
            return lo + (hi - lo) * max(rank - before, 0.0) / count
        before += count
    return None  # pragma: no cover - rank <= total always lands in a bucket
