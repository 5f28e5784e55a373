"""How a rank function may end, and what the launcher then says (issue 37): a function that destroys the
process group itself, as a torchrun script ends, still returns its result; one that sets
`sys.stdout = None` still returns its result (it is not reported as an `os._exit`); a SIGKILL the
function sent itself is not blamed on the out-of-memory killer."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import torch
import torch.distributed as dist

from distlab import launch


def _destroys_the_group() -> int:
    total, rank = torch.ones(1), launch.rank()
    dist.all_reduce(total)
    dist.destroy_process_group()  # the usual last line of a torchrun script
    return int(total.item()) * 10 + rank


def _drops_stdout() -> int:
    sys.stdout = None
    return 7


def _kills_itself() -> None:
    if launch.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_function_that_destroys_the_process_group_returns_its_result():
    assert launch.run(_destroys_the_group, 2) == [20, 21]


def test_a_function_that_sets_stdout_to_none_returns_its_result():
    assert launch.run(_drops_stdout, 2) == [7, 7]


def test_a_sigkill_is_not_claimed_to_be_the_out_of_memory_killer():
    with pytest.raises(launch.RankError) as err:
        launch.run(_kills_itself, 2, timeout=20)
    message = str(err.value)
    assert "killed by SIGKILL" in message and "kill -9" in message, message
    assert "usually the out-of-memory killer" not in message and "needed more memory" not in message
