"""DualPipeV's picture: its simulated timeline beside ZB-V's, the overlapped F & B pairs outlined.

Drawn from the schedules themselves (`dualpipe_v.dualpipev_schedule`, `schedules.zbv_schedule`) through
the simulator, with `dualpipe_v.overlapped_duration`: every chunk carries t_c of its own communication,
exposed when it runs alone and hidden in a pair (DeepSeek-AI 2024, sec. 3.2.1).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from distlab.pipeline.dualpipe_v import (
    compare_with_zbv,
    dualpipev_schedule,
    dualpipev_slots,
    overlapped_duration,
)
from distlab.pipeline.figures import STAGE_UNIT, _styled, draw_timeline
from distlab.pipeline.schedules import zbv_schedule
from distlab.pipeline.simulate import simulate


@_styled
def dualpipev_figure(p: int = 4, m: int = 10, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0,
                     t_c: float = 0.5) -> Figure:
    """ZB-V and DualPipeV simulated on p ranks and m micro-batches, times per chunk, each F and B chunk
    also carrying t_c of communication (exposed alone, hidden in a pair); pairs outlined in black."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.0 * p * 2 + 1.6), sharex=True)
    zbv, dpv = compare_with_zbv(p, m, t_f, t_b, t_w, t_c)
    runs = ((zbv_schedule(p, m), lambda r, a: {"F": t_f + t_c, "B": t_b + t_c, "W": t_w}[a.op], zbv),
            (dualpipev_schedule(p, m), overlapped_duration(p, m, t_f, t_b, t_w, t_c), dpv))
    for ax, (schedule, duration, stats) in zip(axes, runs, strict=True):
        events = simulate(schedule, t_f, t_b, t_w=t_w, duration=duration)
        draw_timeline(ax, events, p, f"{stats.name}: p={p}, m={m}, t_c={t_c:g}; step {stats.makespan:g}, "
                      f"idle or exposed {stats.bubble:.0%}, peak stash {max(stats.peak_stash)} chunks",
                      unit=STAGE_UNIT)
    starts = {(e.rank, e.action): e for e in simulate(runs[1][0], t_f, t_b, t_w=t_w, duration=runs[1][1])}
    for r, slots in enumerate(dualpipev_slots(p, m)):
        for slot in slots:
            if len(slot) == 3:  # an overlapped F & B: outline the pair
                first, last = starts[(r, slot[0])], starts[(r, slot[2])]
                axes[1].add_patch(Rectangle((first.start, r - 0.45), last.end - first.start, 0.9, fill=False,
                                            edgecolor="black", linewidth=0.8))
    return fig
