"""Chapter 7's entry point: the memory estimator, and a measured step of the course's GPT.

    python -m distlab.memory estimate --params 7.5e9 --dp 64 --zero 2 --json
    python -m distlab.memory estimate --layers 96 --hidden 12288 --heads 96 --vocab 50257 --seq 2048 \\
        --tp 8 --pp 8 --dp 16 --zero 1 --recompute selective --json
    python -m distlab.memory measure --layers 2 --hidden 64 --heads 4 --batch 8 --seq 32 --json

`estimate` prints the bytes per GPU (`distlab.memory.estimate.estimator`), each part and the step's peak
(`peak_bytes`, the number chapter 9's planner reports as `memory_gb`); `measure` runs one training step of
`distlab.models.GPT` on this machine and prints what `distlab.memory.measure.accounting` counted beside the
prediction of `distlab.memory.estimate.cost_model`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, fields

from distlab.cli_types import at_least, between
from distlab.memory.estimate import cost_model, estimator, optimizer_step

PROG = "python -m distlab.memory"


# Upper bounds beyond any real job, so that a typo is refused rather than computed (issue 22, item 5)
MODEL = "far beyond any published model"
MACHINE = "no GPU cluster is larger"


def _add_estimate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="bytes per GPU of a configuration",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Per-GPU bytes of model states and activations (give --params, or the "
        "shape --layers --hidden --heads --vocab for activations too). Every size takes e-notation.",
    )
    none = argparse.SUPPRESS  # no default: the help says what happens without the option
    p.add_argument(
        "--params",
        type=between(1, 1e15, float, "a thousand times the largest published models, about 1e12 parameters"),
        default=none,
        help="parameter count Psi, e.g. 7.5e9 (default: from the shape; with a shape, within a factor of 2 "
        "of the shape's count)",
    )
    for name, what, high in (
        ("layers", "transformer layers L", 1e4),
        ("hidden", "hidden size h", 1e6),
        ("heads", "attention heads a", 1e5),
        ("vocab", "vocabulary size V", 1e8),
    ):
        p.add_argument(
            f"--{name}", type=between(1, high, int, MODEL), default=none, help=f"{what} (default: none)"
        )
    p.add_argument("--seq", type=between(1, 1e9, int, MODEL), default=2048, help="sequence length s")
    p.add_argument(
        "--micro-batch", type=between(1, 1e7, int, MODEL), default=1, help="sequences per micro-batch b"
    )
    for name, what in (
        ("dp", "data-parallel"),
        ("tp", "tensor-parallel"),
        ("pp", "pipeline-parallel"),
        ("cp", "context-parallel"),
    ):
        p.add_argument(f"--{name}", type=between(1, 1e7, int, MACHINE), default=1, help=f"{what} size")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage over the dp ranks")
    p.add_argument(
        "--precision",
        choices=tuple(cost_model.PRECISIONS),
        default="mixed",
        help="mixed: 2 + 2 + 12 bytes per parameter, 16-bit activations; fp32: 4 + 4 + 8",
    )
    p.add_argument(
        "--recompute", choices=cost_model.RECOMPUTE, default="none", help="activation recomputation"
    )
    p.add_argument(
        "--offload", action="store_true", help="keep the optimizer state in host memory (ZeRO-Offload)"
    )
    p.add_argument("--fp8", action="store_true",
                   help="FP8 linear layers: their saved inputs in 1 byte (needs --precision mixed)")
    p.add_argument("--schedule", choices=estimator.SCHEDULES, default="1f1b", help="pipeline schedule")
    p.add_argument(
        "--microbatches",
        type=between(1, 1e7, int, MODEL),
        default=none,
        help="micro-batches per step m (default: pp, one per stage)",
    )
    p.add_argument(
        "--interleave", type=between(1, 1e4, int, MODEL), default=1, help="model chunks per pipeline rank v"
    )
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    p.add_argument(
        "--attention",
        choices=cost_model.ATTENTIONS,
        default="math",
        help="math saves the s x s softmax (the paper's count); flash saves a log-sum-exp",
    )
    p.add_argument("--no-dropout", action="store_true", help="no dropout masks")
    p.add_argument(
        "--gpus-per-node",
        type=between(1, 1024, int, MACHINE),
        default=8,
        help="GPUs sharing one host's memory",
    )
    p.add_argument(
        "--host-memory-gb",
        type=between(1e-3, 1e6, float, "no server holds a petabyte"),
        default=none,
        help="host memory per node, to check that offload fits in GB (default: not checked)",
    )
    _add_adam(p)
    p.add_argument("--device", choices=optimizer_step.DEVICES, default="cuda",
                   help="where the step runs; it picks the default Adam implementation")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_measure(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "measure",
        help="measure one training step of the course's GPT here, beside the predicted peak",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Run one training step of distlab.models.GPT with Adam on this machine's CPU, measure "
        "its memory (parameters, gradients, optimizer state, saved activations, temporaries, and the peak "
        "with its phase) and print it beside the prediction of distlab.memory.peak. Sizes take e-notation.",
    )
    for name, default, what in (
        ("layers", 2, "transformer layers L"),
        ("hidden", 64, "hidden size h"),
        ("heads", 4, "attention heads a"),
        ("vocab", 16, "vocabulary size V"),
        ("batch", 8, "sequences per step b"),
        ("seq", 32, "sequence length s"),
    ):
        p.add_argument(
            f"--{name}", type=between(1, 1e6, int, "far beyond one CPU's memory"), default=default, help=what
        )
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the weights and the batch")
    p.add_argument(
        "--precision",
        choices=tuple(cost_model.PRECISIONS),
        default="fp32",
        help="fp32: Adam on fp32 weights; mixed: a bf16 model with fp32 master weights (MasterWeights)",
    )
    p.add_argument(
        "--recompute", choices=cost_model.RECOMPUTE, default="none", help="activation recomputation"
    )
    _add_adam(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_adam(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adam", choices=("default", *optimizer_step.FORMS), default="default",
                   help="Adam's implementation; default: torch's choice on the device (foreach on cuda, "
                   "for-loop on cpu)")


def parser() -> argparse.ArgumentParser:
    """The command line: `estimate` and `measure`, each option with its default in the help."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_estimate(sub)
    _add_measure(sub)
    return p


def run_estimate(args: argparse.Namespace) -> dict[str, object]:
    names = {f.name for f in fields(estimator.MemoryConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    config = estimator.MemoryConfig(**values, dropout=not args.no_dropout)
    data: dict[str, object] = dict(estimator.estimate(config).to_dict())
    data["shape_given"] = config.layers is not None
    return data


def available_bytes() -> int:
    """Physical memory this machine has free now (Linux and macOS report it through sysconf)."""
    try:
        with open("/proc/meminfo") as f:  # Linux: MemAvailable counts the page cache it can drop
            fields_ = dict(line.split(":", 1) for line in f)
        return int(fields_["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def run_measure(args: argparse.Namespace) -> dict[str, object]:
    from distlab.memory.measure.accounting import measure_gpt_step
    from distlab.memory.measure.peak import predict_peak

    if args.hidden % args.heads:
        raise ValueError(
            f"hidden={args.hidden} is not divisible by heads={args.heads}; choose heads that divide it"
        )
    config = estimator.MemoryConfig(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        vocab=args.vocab,
        seq=args.seq,
        micro_batch=args.batch,
        precision=args.precision,
        recompute=args.recompute,
        attention="flash",
        dropout=False,
        adam=args.adam,
        device="cpu",
    )
    predicted = predict_peak(config)
    free = available_bytes()
    if predicted.peak_bytes > 0.8 * free:
        raise ValueError(
            f"this step needs about {predicted.peak_bytes / 1e9:,.1f} GB at its peak (predicted, "
            f"{predicted.phase}) and this machine has {free / 1e9:,.1f} GB available; choose a smaller "
            "--hidden, --layers, --vocab, --batch or --seq (or --recompute full)"
        )
    try:
        measured = measure_gpt_step(
            args.layers,
            args.hidden,
            args.heads,
            args.vocab,
            args.batch,
            args.seq,
            args.precision,
            args.recompute,
            args.seed,
            adam=args.adam,
        )
    except (RuntimeError, MemoryError) as e:  # the allocator ran out after all: say so in one line
        raise ValueError(
            f"the step failed on this machine ({str(e).splitlines()[0]}); choose smaller sizes"
        ) from None
    out: dict[str, object] = {"measured_peak_bytes": measured.peak_bytes, **predicted.to_dict()}
    out |= {f"measured_{k}": v for k, v in asdict(measured).items()}
    out["peak_error"] = predicted.peak_bytes / measured.peak_bytes - 1
    return out


def _show(key: str, value: object) -> str:
    if isinstance(value, (int, float)) and key.endswith("bytes"):
        return f"{value / 1e9:12.3f} GB" if value >= 1e8 else f"{value / 1e6:12.3f} MB"
    if isinstance(value, float):
        return f"{value:12.4g}"
    return str(value)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Parse, compute, print (a table, or JSON with --json); returns the printed data."""
    p = parser()
    args = p.parse_args(argv)
    try:
        data = run_estimate(args) if args.command == "estimate" else run_measure(args)
    except ValueError as e:
        p.error(str(e))
    try:
        _print(data, args.json)
    except BrokenPipeError:  # `... | head` closed the pipe: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return data


def _print(data: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(data))
        return
    width = max(map(len, data))
    for k, v in data.items():
        if k in ("peak_phase", "peak_where", "peak_stage") and not data.get("shape_given", True):
            continue
        if k in ("activations_bytes", "peak_bytes") and not data.get("shape_given", True):
            v = "not estimated: no shape given (add --layers --hidden --heads --vocab)"
        if k != "shape_given":
            print(f"{k:<{width}}  {_show(k, v)}")


if __name__ == "__main__":
    main()
    sys.exit(0)
