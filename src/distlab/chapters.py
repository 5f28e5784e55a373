"""The course's one chapter table: number, title, lab, book page, package and entry point of every chapter.

`distlab --help` (`distlab.cli`) lists its commands from here; README's chapter list and its table of
entry points, and CONTRIBUTING's map of the chapter packages, are printed from it by
`tools/chapter_tables.py` (`tests/test_chapters.py` fails when a file and the table disagree). A new
chapter is a new `Chapter` row, then `python tools/chapter_tables.py`.

An `EntryPoint`'s `command` is a word of the `distlab` command: a chapter package's `python -m
distlab.<command>` (`module` is true), or one of the course's own tools (`distlab doctor`, chapter 0's).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EntryPoint:
    """One command: `distlab COMMAND` (and `python -m distlab.COMMAND` when `module`), a line on what it
    does for `distlab --help`, and the example README shows (Markdown)."""

    command: str
    what: str
    example: str
    module: bool = True


@dataclass(frozen=True)
class Chapter:
    """One chapter: its number, title, lab notebook, book page, its packages under `src/distlab/`, and its
    entry points."""

    number: int
    title: str
    lab: str
    book: str
    packages: tuple[str, ...]
    entry_points: tuple[EntryPoint, ...]
    status: str = "written"

    @property
    def label(self) -> str:
        """The two-digit number the files use: "01"."""
        return f"{self.number:02d}"


def _ep(command: str, what: str, example: str, module: bool = True) -> tuple[EntryPoint, ...]:
    return (EntryPoint(command, what, example, module),)


_RESTART = ("a restart after a killed rank (a two-stage pipeline; it ends with a summary, and `ckpt/` is "
            "ignored by git): `torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m "
            "distlab.parallel3d.restart --dp 1 --pp 2 --tp 1 --micro-batches 2 --steps 8 --every 3 "
            "--kill-at-step 5 --dir ckpt`")

CHAPTERS: tuple[Chapter, ...] = (
    Chapter(0, "Introduction: why one device is not enough; when a run fails",
            "labs/00_when_a_run_fails.ipynb", "book/00-intro.md", ("launch",),
            _ep("doctor", "what this machine has and what the labs will use",
                "`distlab doctor` (GPUs and their links, NCCL, and the backend `distlab.launch.run` will "
                "pick; `--json` for data)", module=False)),
    Chapter(1, "Collective communication", "labs/01_collectives.ipynb", "book/01-collectives.md",
            ("collectives",),
            _ep("collectives", "benchmark our collectives against torch.distributed's, nccl-tests style",
                "`torchrun --nproc-per-node 4 -m distlab.collectives --sizes 1K:256M` (without torchrun: "
                "`python -m distlab.collectives --world-size 4`)")),
    Chapter(2, "Data parallelism: the training loop, bucketed and overlapped gradient all-reduce, no_sync",
            "labs/02_data_parallel.ipynb", "book/02-data-parallel.md", ("data_parallel",),
            _ep("data_parallel", "our data parallelism against DDP: parity and time",
                "`torchrun --nproc-per-node 4 -m distlab.data_parallel --batch 64 --rounds 5` (without "
                "torchrun: `python -m distlab.data_parallel --world-size 1 2 3 4`)")),
    Chapter(3, "Asynchronous SGD: a parameter server, SSP, staleness, Hogwild!", "labs/03_async_sgd.ipynb",
            "book/03-async-sgd.md", ("async_sgd",),
            _ep("async_sgd", "one parameter-server run (sync, async, stale-synchronous)",
                "`torchrun --nproc-per-node 4 -m distlab.async_sgd --mode async --compute-time 0.01` (rank 0 "
                "serves, ranks 1-3 work; without torchrun: `python -m distlab.async_sgd --world-size 4`)")),
    Chapter(4, "Pipeline parallelism: GPipe, 1F1B, interleaving, zero-bubble (ZB-H1, ZB-V), and the bubble",
            "labs/04_pipeline.ipynb", "book/04-pipeline.md", ("pipeline",),
            _ep("pipeline", "run, check and time one pipelined training step",
                "`torchrun --nproc-per-node 4 -m distlab.pipeline --schedule 1f1b -m 8`")),
    Chapter(5, "Tensor parallelism: Megatron's f and g, parallel MLP, attention, vocabulary, sequence "
            "parallelism", "labs/05_tensor_parallel.ipynb", "book/05-tensor-parallel.md",
            ("tensor_parallel",),
            _ep("tensor_parallel", "the tensor-parallel GPT against the dense one, with its communication",
                "`torchrun --nproc-per-node 4 -m distlab.tensor_parallel --dtype float32 "
                "--sequence-parallel` (without torchrun: `--world-size 1 2 3 4`)")),
    Chapter(6, "Mixture of experts: gating, capacity, load balancing, expert parallelism",
            "labs/06_moe.ipynb", "book/06-moe.md", ("moe",),
            _ep("moe", "expert parallelism against the reference, with its traffic",
                "`torchrun --nproc-per-node 4 -m distlab.moe --experts 8 --k 2 --tokens 4096 --d-model 1024` "
                "(without torchrun: `--world-size 2 4`)")),
    Chapter(7, "Memory: accounting, mixed precision, accumulation, recomputation, the estimator, ZeRO and "
            "offload", "labs/07_memory.ipynb", "book/07-memory.md", ("memory",),
            _ep("memory", "the memory estimator, and a measured step",
                "`python -m distlab.memory estimate --params 7.5e9 --dp 64 --zero 2 --json` (bytes per GPU; "
                "also `measure`)")),
    Chapter(8, "The hardware underneath: PCIe, NVLink, NVSwitch, InfiniBand/RDMA", "labs/08_hardware.ipynb",
            "book/08-hardware.md", ("hardware",),
            _ep("hardware", "this machine's data paths beside the catalog's figures",
                "`python -m distlab.hardware --out assets/hardware/MACHINE.json` (host, GPU and collective "
                "bandwidth beside the spec)")),
    Chapter(9, "Putting it together: data, pipeline and tensor parallelism on one DeviceMesh, placement on "
            "servers, a planner checked against published runs, many nodes (torchrun, SLURM, NCCL over "
            "InfiniBand), sharded checkpoints, resharding and restarts", "labs/09_putting_it_together.ipynb",
            "book/09-putting-it-together.md", ("parallel3d", "plan"),
            (EntryPoint("parallel3d", "train the GPT on a dp x pp x tp mesh and check it",
                        "`python -m distlab.parallel3d --dp 2 --pp 2 --tp 1` (ranks started by "
                        f"distlab.launch; world size dp x pp x tp); {_RESTART}"),
             EntryPoint("plan", "rank the ways to train a model on a cluster",
                        "the planner, no ranks: `python -m distlab.plan --published llama3-405b-8k "
                        "--explain` (`--json` for every kept candidate; `--gpu H200` and the other GPUs of "
                        "`distlab.catalog`)"))),
    Chapter(10, "Context parallelism: ring attention, the online-softmax merge, zig-zag load balancing",
            "labs/10_context_parallel.ipynb", "book/10-context-parallelism.md", ("context_parallel",),
            _ep("context_parallel", "ring attention against dense attention",
                "`python -m distlab.context_parallel --world-size 4 --seq-len 32` (parity with dense "
                "attention; work and bytes per rank)")),
    Chapter(11, "Training that survives failures and slow links: HSDP on a replicate x shard mesh, "
            "replicas that agree on a quorum and heal from a live peer, goodput against checkpoint-restart, "
            "local SGD, DiLoCo and streaming DiLoCo, checked against torchft",
            "labs/11_fault_tolerance.ipynb", "book/11-fault-tolerance.md", ("fault_tolerance",),
            _ep("fault_tolerance", "replicas that lose one and heal, checked; goodput against checkpoints",
                "`python -m distlab.fault_tolerance heal --replicas 4 --kill 2:2 --join 3:4` (a replica "
                "killed and one joining, checked against one process on the quorum's data); no ranks: "
                "`python -m distlab.fault_tolerance goodput --failures-per-day 20`")),
    Chapter(12, "Dry runs: one rank of a published 16K-GPU layout on a laptop (fake process group, meta "
            "tensors), its bytes and memory beside the models", "labs/12_dry_runs.ipynb",
            "book/12-dry-runs.md", ("dryrun",),
            _ep("dryrun", "one rank of a published layout on a laptop, against the models",
                "`python -m distlab.dryrun --published llama3-405b-16k --rank 5` (one rank's calls, bytes "
                "and memory against chapters 9 and 7)")),
    Chapter(13, "Seeing inside a run: profiler traces merged across ranks, overlap measured, memory over "
            "time, a hang found from the flight recorder, a straggler found", "labs/13_inside_a_run.ipynb",
            "book/13-inside-a-run.md", ("observe",),
            _ep("observe", "planted hangs diagnosed from flight records; a slowed rank found",
                "`python -m distlab.observe hang --world-size 4 --plantings 5` (which rank broke which "
                "collective, and the hit rate); `python -m distlab.observe straggler --world-size 4`")),
)


def entry_points() -> list[tuple[Chapter, EntryPoint]]:
    """Every (chapter, entry point), in chapter order."""
    return [(c, e) for c in CHAPTERS for e in c.entry_points]


def modules() -> list[str]:
    """The chapter packages run as `python -m distlab.<name>`, in chapter order."""
    return [e.command for _, e in entry_points() if e.module]


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = ("| " + " | ".join(header) + " |").replace("|  |", "| |")
    lines = [head, "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def readme_chapters() -> str:
    """README's chapter list."""
    return _table(("", "chapter", "lab", "status"),
                  [(c.label, c.title, f"`{c.lab}`", c.status) for c in CHAPTERS])


def readme_entry_points() -> str:
    """README's "Every chapter has such an entry point" table."""
    return _table(("chapter", "entry point"),
                  [(c.label, "; ".join(e.example for e in c.entry_points)) for c in CHAPTERS])


def contributing_packages() -> str:
    """CONTRIBUTING's map of the floors: each chapter's package(s), lab, book page and command."""
    rows = [(c.label, ", ".join(f"`{p}/`" for p in c.packages), f"`{c.book}`", f"`{c.lab}`",
             ", ".join(f"`distlab {e.command}`" for e in c.entry_points)) for c in CHAPTERS]
    return _table(("chapter", "package", "book", "lab", "command"), rows)


# The generated tables: (file, marker name, the function that prints it). tools/chapter_tables.py writes
# each after the line `<!-- chapters.py: NAME ... -->` of its file and an empty line.
GENERATED = (("README.md", "chapters", readme_chapters), ("README.md", "entry-points", readme_entry_points),
             ("CONTRIBUTING.md", "packages", contributing_packages))


def marker(name: str) -> str:
    """The comment line a generated table follows."""
    return f"<!-- chapters.py: {name} (tools/chapter_tables.py writes the table below) -->"


def rewrite(text: str, name: str, table: str) -> str:
    """`text` with the table after `marker(name)` replaced by `table`; ValueError if the marker is absent."""
    lines = text.split("\n")
    if marker(name) not in lines:
        raise ValueError(f"no line {marker(name)!r}: put it where the {name} table belongs")
    start = lines.index(marker(name)) + 1  # then one empty line (Markdown starts the table as a new block)
    lines[start:start] = [] if start < len(lines) and lines[start] == "" else [""]
    start += 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + table.split("\n") + lines[end:])
