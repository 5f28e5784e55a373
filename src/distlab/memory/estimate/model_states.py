"""Model states per GPU: how many parameters one GPU holds, and the bytes of their weights, gradients and
optimizer state.

A GPT block's weights are split by tensor parallelism (the column-parallel layers' biases with them, the
LayerNorms and the row-parallel biases replicated), the blocks over the pipeline's stages, the embedding on
the first stage and the output layer on the last (Narayanan et al. 2021; Shoeybi et al. 2019). Each
parameter then costs 2 + 2 + K bytes under mixed precision (K = 12) or 4 + 4 + 8 in fp32, divided by
ZeRO's stage over the dp ranks (Rajbhandari et al. 2020, sec. 5); with offload the optimizer state lives in
the host's memory instead (Ren et al. 2021, "ZeRO-Offload"). Modern shapes (`distlab.memory.estimate.shape`)
and uneven pipeline splits count the stage that holds the most.
"""

from __future__ import annotations

from dataclasses import replace

from distlab.memory.estimate import cost_model, shape
from distlab.memory.estimate.config import MemoryConfig, total_params


def _stage_params(c: MemoryConfig) -> float:
    """Parameters one GPU holds on the pipeline stage that holds the most (modern shapes, uneven splits)."""
    h, t = c.hidden, c.tp
    f = c.ffn or 4 * h
    hkv = c.model_shape.kv_width
    biases = (h + 2 * hkv + f * (2 if c.gated else 1)) / t + 6 * h  # split column biases; norms, row biases
    per_layer = c.model_shape.block_weights / t + biases
    split = shape.stage_layers(c.layers, c.pp, c.layer_split)
    embed = c.vocab * h / t + (c.seq * h if c.positions else 0)
    head = (c.vocab * h / t if (not c.tied or c.pp > 1) else 0) + 2 * h
    if c.pp == 1:
        return split[0] * per_layer + embed + head
    return max(split[0] * per_layer + embed, split[-1] * per_layer + head, max(split) * per_layer)


def params_per_gpu(c: MemoryConfig) -> float:
    """Parameters one GPU holds on the pipeline's first stage (the one with the embedding)."""
    if c.layers is None:
        return c.params / (c.tp * c.pp)
    if c.modern:
        stage = _stage_params(c)
        return stage * c.params / total_params(replace(c, params=None)) if c.params is not None else stage
    h, t = c.hidden, c.tp
    per_layer = 12 * h * h / t + 7 * h / t + 6 * h  # column-parallel biases split; LayerNorms, row biases not
    stage = c.layers / c.pp * per_layer + c.vocab * h / t + c.seq * h + (2 * h if c.pp == 1 else 0)
    if c.params is not None:  # the caller's count, split in the same proportions
        total = c.layers * (12 * h * h + 13 * h) + c.vocab * h + c.seq * h + 2 * h
        return stage * c.params / total
    return stage



def states_per_gpu(c: MemoryConfig) -> tuple[float, float, float, float]:
    """Bytes per GPU of (parameters, gradients, optimizer state on the GPU, optimizer state offloaded to the
    host); raises a ValueError if the offloaded state does not fit `c.host_memory_gb` per node."""
    n = params_per_gpu(c)
    p, g, o = cost_model.model_state_bytes(n, c.precision, c.zero, c.dp)
    host = o if c.offload else 0.0
    if c.offload:
        o = 0.0
        if c.host_memory_gb is not None and host * c.gpus_per_node > c.host_memory_gb * 1e9:
            raise ValueError(
                f"offload needs {host * c.gpus_per_node / 1e9:.1f} GB of host memory per node "
                f"({c.gpus_per_node} GPUs x {host / 1e9:.1f} GB of optimizer state) but "
                f"host_memory_gb={c.host_memory_gb}; shard it with zero >= 1 over more dp ranks, "
                "or turn offload off"
            )
    return p, g, o, host
