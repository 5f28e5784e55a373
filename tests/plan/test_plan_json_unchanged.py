"""`python -m distlab.plan --json` prints the same bytes as before the planner's candidates and the
published runs took their sizes from `distlab.layout.Layout` (issue 36, item 1, a pure refactor).

The golden digests were made by running the code before that change (commit dad0c2b) on these command
lines: a search of the tiny preset and two pinned configurations (GPT-3 on 16 H100s; a grouped-query,
SwiGLU shape with context parallelism). A digest, not the text: the search prints 370 KB."""

from __future__ import annotations

import contextlib
import hashlib
import io

import pytest

from distlab.plan.__main__ import main

GOLDEN = [  # (command line, characters printed, sha256 of what it printed)
    ('--preset tiny --nodes 1 --gpus-per-node 4 --batch 8 --top 3 --json',
     373866, '268dbd3a38ac1a162c5a9fc12be0b7d88c7bcf7b7d8feb2178fbc482e9679b6d'),
    ('--preset gpt3-175b --gpu H100 --nodes 2 --dp 2 --tp 8 --pp 1 --cp 1 --zero 1 --recompute full -'
     '-micro-batch 1 --interleave 1 --json',
     2288, '476ec872105972ffc42433be7053550a1453e19bc8e9e19eb2021ec94957170b'),
    ('--layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq 8192 --kv-heads 8 --ffn 14336 --gated '
     '--gpu H100 --nodes 2 --dp 2 --tp 4 --pp 1 --cp 2 --zero 3 --recompute selective --micro-batch 1'
     ' --interleave 1 --json',
     2329, '173a156fdeac0be623f28681ab18c046756d5ff3d7f70a7b4ca0c5f857c30176'),
]


def printed(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(argv)
    return buf.getvalue()


@pytest.mark.parametrize(("args", "chars", "digest"), GOLDEN,
                         ids=["search-tiny", "pinned-gpt3", "pinned-gqa-cp"])
def test_plan_json_is_byte_identical(args: str, chars: int, digest: str) -> None:
    text = printed(args.split())
    assert (len(text), hashlib.sha256(text.encode()).hexdigest()) == (chars, digest), text[:2000]
