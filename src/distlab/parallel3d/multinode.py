"""Many nodes: the torchrun and SLURM commands for a mesh, and a real two-"node" job on one machine.

On a cluster one torchrun agent runs per node; the agents meet at a rendezvous point (c10d: a TCP store
on the first node), agree on the world, and number the workers node by node, so that global rank =
node rank x processes per node + local rank (torchrun's GROUP_RANK and LOCAL_RANK). `distlab.mesh.grid`
makes the last dim the innermost: consecutive global ranks. So with tp <= processes per node, every tp
group lies inside one node, on NVLink, and only dp's (and pp's) traffic crosses the network, as
Narayanan et al. 2021 (sec. 3.2) place Megatron's tensor parallelism.

`torchrun_command` and `sbatch_script` write what the book shows; `run_local_nodes` starts `nnodes`
torchrun agents as subprocesses of this machine, each as if it were a node, for the test and the lab.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence


def check_layout(dp: int, tp: int, nnodes: int, nproc_per_node: int) -> None:
    """Raise a ValueError unless dp x tp ranks fill the nodes and each tp group fits in one node."""
    for name, value in (("dp", dp), ("tp", tp), ("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if dp * tp != nnodes * nproc_per_node:
        raise ValueError(f"dp x tp = {dp} x {tp} = {dp * tp} ranks, but nnodes x nproc_per_node = "
                         f"{nnodes} x {nproc_per_node} = {nnodes * nproc_per_node} processes; "
                         "make the two products equal")
    if nproc_per_node % tp:
        raise ValueError(f"tp={tp} does not divide nproc_per_node={nproc_per_node}, so a tp group would span "
                         "two nodes and its all-reduces would cross the network; choose tp dividing it")


def torchrun_command(module: str, args: Sequence[str], *, nnodes: int, nproc_per_node: int,
                     endpoint: str = "$MASTER_ADDR:29500", node_rank: str | None = None,
                     max_restarts: int = 0, rdzv_id: str = "$SLURM_JOB_ID") -> str:
    """The torchrun line one node runs for a multi-node job with c10d rendezvous (PyTorch's torchrun
    documentation, "Multi-node multi-worker"). `node_rank` None lets the rendezvous number the nodes."""
    parts = ["torchrun", f"--nnodes {nnodes}", f"--nproc-per-node {nproc_per_node}",
             "--rdzv-backend c10d", f"--rdzv-endpoint {endpoint}", f"--rdzv-id {rdzv_id}"]
    if node_rank is not None:
        parts.append(f"--node-rank {node_rank}")
    if max_restarts:
        parts.append(f"--max-restarts {max_restarts}")
    parts += [f"-m {module}", *args]
    return " \\\n    ".join(parts)


def sbatch_script(dp: int, tp: int, *, nnodes: int = 2, gpus_per_node: int = 8, steps: int = 1000,
                  every: int = 100, ckpt_dir: str = "$SCRATCH/ckpt") -> str:
    """A SLURM batch script that starts one torchrun agent per node (srun --ntasks-per-node=1), with the
    first node of the allocation as the c10d rendezvous point and one restart allowed."""
    check_layout(dp, tp, nnodes, gpus_per_node)
    run = torchrun_command("distlab.parallel3d.restart",
                           [f"--dp {dp} --tp {tp}", f"--steps {steps} --every {every}", f"--dir {ckpt_dir}"],
                           nnodes=nnodes, nproc_per_node=gpus_per_node, max_restarts=1)
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the workers",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        "#SBATCH --cpus-per-task=32",
        "#SBATCH --time=02:00:00",
        "",
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        "export NCCL_DEBUG=WARN                 # INFO once, to see which transport NCCL picked",
        "",
        "srun " + run,
    ]) + "\n"


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_agents(commands: Sequence[Sequence[str]], *, timeout: float = 120.0,
               env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None) -> list[str]:
    """Run torchrun agents (one command each) side by side, in the directory `cwd` (None: this one), and
    return their outputs (stdout and stderr together). Each agent runs in its own session, so that on a
    timeout or an error the agent and all the workers it started are killed together: nothing is left
    behind."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    procs = [subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=full_env, start_new_session=True, cwd=cwd) for cmd in commands]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    except subprocess.TimeoutExpired as e:
        raise TimeoutError(f"the torchrun agents did not finish within timeout={timeout} s "
                           f"({shlex.join(procs[0].args)}); raise the timeout or look for a hung rank") from e
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    failed = [i for i, p in enumerate(procs) if p.returncode]
    if failed:
        raise RuntimeError(f"torchrun agent(s) {failed} exited with codes "
                           f"{[procs[i].returncode for i in failed]}; output of agent {failed[0]}:\n"
                           + outputs[failed[0]][-3000:])
    return outputs


def run_standalone(module_args: Sequence[str], *, nproc: int, max_restarts: int = 0,
                   timeout: float = 120.0, cwd: str | os.PathLike | None = None) -> str:
    """`torchrun --standalone --nproc-per-node nproc --max-restarts k <module_args>` on this machine, in
    the directory `cwd`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", str(max_restarts), *module_args]
    return run_agents([cmd], timeout=timeout, cwd=cwd)[0]


def run_local_nodes(module_args: Sequence[str], *, nnodes: int = 2, nproc_per_node: int = 2,
                    timeout: float = 120.0) -> list[str]:
    """Start `nnodes` torchrun agents on this machine, as if each were a node, all meeting at one c10d
    rendezvous on 127.0.0.1 (a free port); return each agent's output."""
    endpoint = f"127.0.0.1:{free_port()}"
    cmds = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node",
             str(nproc_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
             "--rdzv-id", "distlab-local", "--node-rank", str(node), *module_args] for node in range(nnodes)]
    return run_agents(cmds, timeout=timeout)
