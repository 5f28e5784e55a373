"""Chapter 13: seeing inside a run: traces, overlap, memory over time, hangs and stragglers.

One idea per file:
- `intervals`: exact union, intersection and difference of time intervals (what overlap is made of).
- `flight`: torch's flight recorder, read in a rank: the last collectives with their sequence numbers.
- `hang`: the first sequence number where the ranks' records diverge, and the rank that broke it.
- `plant`: a small program of collectives and planted mistakes (skip, order, size) to find.
- `straggler`: per-rank work and wait times, and the median + k * MAD outlier rule.
"""

from distlab.observe.flight import CollectiveRecord, records_from_dump
from distlab.observe.hang import Divergence, diagnose
from distlab.observe.plant import Planting, random_planting, run_planted
from distlab.observe.straggler import StragglerReport, find_stragglers, outliers, timed_steps

__all__ = ["CollectiveRecord", "Divergence", "Planting", "StragglerReport", "diagnose", "find_stragglers",
           "outliers", "random_planting", "records_from_dump", "run_planted", "timed_steps"]
