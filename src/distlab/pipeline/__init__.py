"""Chapter 4: pipeline parallelism, its schedules and their bubbles.

A pipeline runs inside one process group (`group=`, None for the whole world; or one dim of a
`distlab.mesh` grid); every rank number in a schedule is a position in that group. One idea per file:
- `partition`: cut a model's layers into stages balanced by a cost (parameter count) or by hand.
- `actions`: `Action` and `Schedule`, the data a schedule is made of, and the tables of what each compute
  op needs (`REQUIRES`) and which message it moves (`FLOWS`); `communication`: where the sends and
  receives go so that nothing deadlocks (`add_communication`).
- `schedules`: the schedules as data, per rank an ordered list of F, B (W), send and recv `Action`s:
  `naive_schedule`, `gpipe_schedule` (Huang et al. 2019), `one_f_one_b_schedule` (PipeDream-Flush,
  Narayanan et al. 2019, 2021), `interleaved_schedule` (Narayanan et al. 2021), `zb_h1_schedule` and
  `zbv_schedule` (Qi et al. 2023; 2024).
- `zero_bubble`: the backward split into B (input gradient) and W (weight gradient), and the orders that
  put the W's into the bubble: `zb_h1_order` (Qi et al. 2023) and `zbv_order` (Qi et al. 2024);
  `torch_orders`: PyTorch's own zero-bubble orders, built without running them, beside ours.
- `dualpipe_v`: DualPipeV (DeepSeek-AI 2024), overlapped F&B pairs on the V placement, beside torch's
  `ScheduleDualPipeV` and ZB-V; `dualpipe_v_figures`: its timeline beside ZB-V's.
- `cost_model`: the closed forms, `bubble_fraction`, `predicted_peak_stash`, `zero_bubble_idle` and
  `zero_bubble_fraction`.
- `validate`: check a schedule on paper (F before B, each once, sends matched, no deadlock on gloo or NCCL).
- `simulate`: the ideal timeline of a schedule from t_f, t_b and t_comm; bubble and peak stash.
- `stage`: one `Stage` (module, stashes, forward, backward, and the backward split into B and W);
  `p2p`: messages by position in the group;
  `executor`: `run_schedule`, a loop that hands each action to its handler, timing every one.
- `train`: a training step of the MLP with it, and the single-process step it must equal; `parity`: the
  verdict of one against the other; `gpt`: the same for the GPT's blocks, with the tied embedding's
  gradient summed between the first and the last stage inside the group.
- `figures`: Gantt charts, bubble and memory plots, the explorer; `exercises`: the lab's check.
- `__main__`: `python -m distlab.pipeline` (or under torchrun) runs and checks one pipelined step.
"""

from distlab.pipeline.actions import Action, Schedule
from distlab.pipeline.communication import DeadlockError, add_communication
from distlab.pipeline.cost_model import (
    bubble_fraction,
    predicted_peak_stash,
    zero_bubble_fraction,
    zero_bubble_idle,
)
from distlab.pipeline.partition import balanced_boundaries, parameter_costs, stage_modules
from distlab.pipeline.schedules import (
    SCHEDULES,
    gpipe_schedule,
    interleaved_schedule,
    make_schedule,
    naive_schedule,
    one_f_one_b_schedule,
    zb_h1_schedule,
    zbv_schedule,
)
from distlab.pipeline.simulate import Event, simulate, timeline_stats
from distlab.pipeline.validate import validate

__all__ = [
    "SCHEDULES",
    "Action",
    "DeadlockError",
    "Event",
    "Schedule",
    "add_communication",
    "balanced_boundaries",
    "bubble_fraction",
    "gpipe_schedule",
    "interleaved_schedule",
    "make_schedule",
    "naive_schedule",
    "one_f_one_b_schedule",
    "parameter_costs",
    "predicted_peak_stash",
    "simulate",
    "stage_modules",
    "timeline_stats",
    "validate",
    "zb_h1_schedule",
    "zbv_schedule",
    "zero_bubble_fraction",
    "zero_bubble_idle",
]
