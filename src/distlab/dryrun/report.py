"""A dry run's report as text: the calls per mesh axis, then what was measured beside the closed forms.

`calls_table` lists, per (axis, collective), the calls, the group size, the whole buffers B and what this
rank sends (`comm_log`'s ring bytes); `agreement_table` sets chapter 9's transfers and chapter 7's memory
beside the measurements with their relative difference. Bytes are printed in GB (1e9 bytes), rounded to
what the comparison needs, so the text is the same on every machine.
"""

from __future__ import annotations

from distlab.dryrun.cost_model import Agreement
from distlab.dryrun.run import DryRun

__all__ = ["agreement_table", "calls_table", "fits", "fits_line", "to_dict"]


def _gb(x: float) -> str:
    return f"{x / 1e9:10.3f}"


def calls_table(run: DryRun) -> str:
    """The calls this rank made in the step, per mesh axis and collective."""
    c = run.coords
    head = f"rank {run.rank} of {run.layout.name} at (pp, dp, tp) = ({c['pp']}, {c['dp']}, {c['tp']})"
    lines = [head, f"{'axis':>4} {'collective':<15}{'calls':>6}{'group':>7}{'B (GB)':>11}{'sent (GB)':>11}"]
    for c in sorted(run.calls, key=lambda c: (c.axis, c.op)):
        lines.append(f"{c.axis:>4} {c.op:<15}{c.calls:6d}{c.group_size:7d} {_gb(c.nbytes)} "
                     f"{_gb(c.sent_bytes)}")
    lines.append(f"(and {run.control_calls} control all-reduce of ZeRO's gradient flags, left out)")
    return "\n".join(lines)


def agreement_table(a: Agreement) -> str:
    """Measured beside predicted, per (axis, kind) of traffic and per kind of memory."""
    lines = [f"{'what':<24}{'measured GB':>13}{'model GB':>12}{'diff':>9}"]
    for (axis, kind), (got, want, d) in sorted(a.traffic.items()):
        lines.append(f"{'sent ' + axis + ' ' + kind:<24} {_gb(got)}  {_gb(want)} {d:8.2%}")
    for kind, (got, want, d) in a.memory.items():
        lines.append(f"{'held ' + kind:<24} {_gb(got)}  {_gb(want)} {d:8.2%}")
    return "\n".join(lines)


def fits(run: DryRun) -> bool | None:
    """Whether everything the rank held at once (model states and the peak of the saved activations) is at
    most its GPU's HBM; None for a layout without a GPU. A lower bound on what the run needs: the
    allocator's fragmentation, temporary buffers and NCCL's own buffers come on top."""
    if run.layout.hbm_bytes <= 0:
        return None
    return run.memory.total <= run.layout.hbm_bytes


def fits_line(run: DryRun) -> str:
    """One sentence: the bytes held beside the GPU's HBM, with attention's path named, and the verdict."""
    held = run.memory.total
    what = f"held in all {held / 1e9:.1f} GB (attention: {run.attention})"
    verdict = fits(run)
    if verdict is None:
        return f"{what}; no GPU given for {run.layout.name}, so no memory verdict"
    gpu = f"one {run.layout.gpu}'s {run.layout.hbm_bytes / 1e9:.0f} GB of HBM"
    if verdict:
        return f"{what}, {held / run.layout.hbm_bytes:.0%} of {gpu}: fits"
    return f"{what}, {held / run.layout.hbm_bytes:.1f}x {gpu}: DOES NOT FIT"


def to_dict(run: DryRun, a: Agreement) -> dict:
    """The report as data (for --json)."""
    return {"layout": run.layout.name, "rank": run.rank, "coords": run.coords,
            "world_size": run.layout.world_size, "source": run.layout.source,
            "calls": [vars(c) for c in run.calls], "control_calls": run.control_calls,
            "memory": run.memory.to_dict(), "attention": run.attention, "gpu": run.layout.gpu,
            "hbm_bytes": run.layout.hbm_bytes, "fits": fits(run),
            "traffic_vs_model": {f"{ax}/{k}": list(v) for (ax, k), v in a.traffic.items()},
            "memory_vs_model": {k: list(v) for k, v in a.memory.items()}, "worst": a.worst()}
