"""Tensor parallelism (chapter 5): bad sizes and bad inputs on one process, and the command line's usage
errors. The same bad inputs on 2 to 4 ranks (every rank must raise, none may hang) are checked in
test_tensor_parallel.py, inside the launches that also run the parity checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from distlab.models import GPT, GPTConfig
from distlab.tensor_parallel.__main__ import main, parser
from distlab.tensor_parallel.layers import check_divisible, check_token_ids
from distlab.tensor_parallel.model import ParallelGPT, check_config, shard_state_dict

CONFIG = GPTConfig(vocab_size=24, block_size=16, n_layer=1, n_head=12, n_embd=48)


@pytest.mark.parametrize("kwargs, p, message", [
    ({"n_head": 6, "n_embd": 48}, 4,
     "n_head=6 is not divisible by tensor-parallel size 4; choose a size that divides 6"),
    ({"n_head": 4, "n_embd": 48, "vocab_size": 25}, 2, "vocab_size=25 is not divisible by tensor-parallel "
                                                       "size 2; choose a size that divides 25"),
    ({"n_head": 5, "n_embd": 40}, 2, "n_head=5 is not divisible by tensor-parallel size 2"),
    ({"n_head": 4, "n_embd": 48, "dropout": 0.1}, 2, "dropout=0.1 is not supported by ParallelGPT"),
])
def test_config_not_divisible_names_value_and_divisor(kwargs, p, message):
    cfg = GPTConfig(**({"vocab_size": 24} | kwargs))
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_config(cfg, p)


def test_sizes_and_ranks_are_checked():
    with pytest.raises(ValueError, match="tensor-parallel size 0 must be a positive integer"):
        check_config(CONFIG, 0)
    assert check_divisible("n_embd", 48, 3) == 16
    with pytest.raises(ValueError, match=r"rank=2 must be a position in the group, 0 \.\. 1"):
        shard_state_dict(GPT(CONFIG).state_dict(), CONFIG, 2, 2)


def test_out_of_range_ids_raise_the_dense_models_error_type():
    """The dense GPT raises IndexError for an id or a target outside the vocabulary; so does ParallelGPT,
    naming the id and the range (it used to look such ids up as zeros and return a finite loss)."""
    torch.manual_seed(0)
    dense = GPT(CONFIG)
    model = ParallelGPT.from_dense(dense)
    idx = torch.randint(24, (2, 8))
    big = idx.index_put((torch.tensor(1), torch.tensor(2)), torch.tensor(24))
    for bad_idx, targets, where in ((big, None, r"idx\[1, 2\] = 24"),
                                    (idx, idx - 30, r"targets\[0, 0\] = -\d+"),
                                    (idx, torch.full_like(idx, 24), r"targets\[0, 0\] = 24")):
        with pytest.raises(IndexError):
            dense(bad_idx, targets)
        with pytest.raises(IndexError, match=rf"{where} is outside the vocabulary: token ids must lie in "
                                             r"\[0, vocab_size=24\)"):
            model(bad_idx, targets)


def test_token_id_checks():
    check_token_ids(torch.tensor([0, 23], dtype=torch.int32), 24)  # int32 ids are fine for an embedding
    check_token_ids(torch.tensor([-100, 3]), 24, "targets", ignore_index=-100)
    with pytest.raises(TypeError, match=r"targets has dtype torch.int32; token ids must be integers of "
                                        r"dtype torch.int64: convert with targets.long\(\)"):
        check_token_ids(torch.tensor([1], dtype=torch.int32), 24, "targets", ignore_index=-100)
    with pytest.raises(ValueError, match=r"idx has shape \(8,\); ParallelGPT takes token ids of shape "
                                         r"\(B, T\): add a batch dimension"):
        ParallelGPT(CONFIG)(torch.zeros(8, dtype=torch.long))


# --- the command line --------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--world-size", "0"], "argument --world-size: 0 must be at least 1"),
    (["--world-size", "5"], "argument --world-size: n_head=12 is not divisible by tensor-parallel size 5"),
    (["--batch", "0"], "argument --batch: 0 must be at least 1"),
    (["--hidden", "50"], "argument --hidden: 50 is not divisible by --heads 12"),
    (["--sequence-parallel", "--seq", "10", "--world-size", "4"],
     "argument --seq: 10 is not divisible by --world-size 4"),
    (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["--tp", "2"], "unrecognized arguments: --tp 2"),
])
def test_command_line_rejects_bad_values_with_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m distlab.tensor_parallel") and message in err


def test_command_line_help_shows_every_default():
    text = parser().format_help()
    for option in ("--world-size", "--batch", "--seq", "--hidden", "--heads", "--layers", "--vocab",
                   "--dtype", "--seed"):
        assert option in text
    assert text.count("(default:") >= 10


def test_command_line_runs_one_process_as_a_module():
    done = subprocess.run([sys.executable, "-m", "distlab.tensor_parallel", "--world-size", "1", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"passed": true' in done.stdout and '"same_as_expected": true' in done.stdout
