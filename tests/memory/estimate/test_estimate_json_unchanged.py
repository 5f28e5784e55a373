"""`python -m distlab.memory estimate --json` prints the same text as before `MemoryConfig` exposed its
sizes as a `distlab.layout.Layout` and its shape as a `distlab.model_shape.ModelShape` (issue 36, items 1
and 2, a pure refactor). The golden strings were printed by the code before that change (commit dad0c2b)."""

from __future__ import annotations

import contextlib
import io

import pytest

from distlab.memory.__main__ import main

GOLDEN = {  # command line: what it printed
    ('estimate --params 7.5e9 --dp 64 --zero 2 --json'):
        ('{"n_params": 7500000000.0, "params_bytes": 15000000000.0, "grads_bytes": 234375000.0, "opti'
         'mizer_bytes": 1406250000.0, "model_states_bytes": 16640625000.0, "activations_bytes": 0.0, '
         '"total_bytes": 16640625000.0, "host_bytes": 0.0, "layers_per_stage": 0.0, "in_flight_layers'
         '": 0.0, "peak_bytes": null, "peak_phase": null, "peak_where": null, "peak_stage": null, "sh'
         'ape_given": false}\n'),
    ('estimate --layers 48 --hidden 6144 --heads 48 --vocab 51200 --seq 2048 --micro-batch 2 --dp 4 -'
     '-tp 4 --pp 4 --cp 2 --zero 1 --recompute selective --schedule interleaved --microbatches 8 --in'
     'terleave 2 --sequence-parallel --json'):
        ('{"n_params": 22074273792, "params_bytes": 2901504000.0, "grads_bytes": 2901504000.0, "optim'
         'izer_bytes": 4352256000.0, "model_states_bytes": 10155264000.0, "activations_bytes": 705901'
         '3632.0, "total_bytes": 17214277632.0, "host_bytes": 0.0, "layers_per_stage": 12.0, "in_flig'
         'ht_layers": 66.0, "peak_bytes": 17510351432, "peak_phase": "backward", "peak_where": "layer'
         ' 11 backward (attention)", "peak_stage": 0, "shape_given": true}\n'),
    ('estimate --layers 4 --hidden 256 --heads 8 --vocab 1024 --seq 512 --dp 2 --zero 3 --precision f'
     'p32 --offload --json'):
        ('{"n_params": 3552768, "params_bytes": 7105536.0, "grads_bytes": 7105536.0, "optimizer_bytes'
         '": 0.0, "model_states_bytes": 14211072.0, "activations_bytes": 113254400.0, "total_bytes": '
         '127465472.0, "host_bytes": 14211072.0, "layers_per_stage": 4.0, "in_flight_layers": 4, "pea'
         'k_bytes": 138014728, "peak_phase": "backward", "peak_where": "layer 3 backward (attention)"'
         ', "peak_stage": 0, "shape_given": true}\n'),
}


@pytest.mark.parametrize("args", list(GOLDEN), ids=["params-zero2", "shape-4d-interleaved", "tiny-offload"])
def test_estimate_json_is_unchanged(args: str) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(args.split())
    assert buf.getvalue() == GOLDEN[args]
