"""Chapter 13: seeing inside a run: traces, overlap, memory over time, hangs and stragglers.

One idea per file:
- `intervals`: exact union, intersection and difference of time intervals (what overlap is made of).
- `trace`: a rank's Chrome trace as computation and communication spans; the ranks' traces merged into
  one timeline (pid = rank), which Perfetto and chrome://tracing open.
- `overlap`: computation, communication, hidden and exposed communication and idle time of one rank.
- `profiled`: chapter 2's strategies and chapter 5's MLP step profiled on a rank.
- `measured`: the variants traced, and checked against chapter 2's `comm_log` and `StepTimeline`.
- `allocations`: memory over one training step (profiler memory events; the CUDA allocator's snapshot).
- `flight`: torch's flight recorder, read in a rank: the last collectives with their sequence numbers.
- `hang`: the first sequence number where the ranks' records diverge, and the rank that broke it.
- `plant`: a small program of collectives and planted mistakes (skip, order, size) to find.
- `straggler`: per-rank work and wait times, and the median + k * MAD outlier rule.
- `figures`: the chapter's pictures and the hang explorer; `exercises`: the lab's check;
  `__main__`: `python -m distlab.observe hang|straggler`.
"""

from distlab.observe.flight import CollectiveRecord, records_from_dump
from distlab.observe.hang import Divergence, diagnose
from distlab.observe.overlap import Overlap, overlap
from distlab.observe.plant import Planting, random_planting, run_planted
from distlab.observe.straggler import StragglerReport, find_stragglers, outliers, timed_steps
from distlab.observe.trace import Span, merge, spans

__all__ = ["CollectiveRecord", "Divergence", "Overlap", "Planting", "Span", "StragglerReport", "diagnose",
           "find_stragglers", "merge", "outliers", "overlap", "random_planting", "records_from_dump",
           "run_planted", "spans", "timed_steps"]
