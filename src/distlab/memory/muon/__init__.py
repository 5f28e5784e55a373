"""Distributed Muon (Jordan et al. 2024): an optimizer that is not element-wise, on data-parallel ranks.

ZeRO shards Adam because Adam works element by element; Muon orthogonalises each weight *matrix* with
Newton-Schulz iterations, so some rank must hold each matrix whole. Two layouts do it:
- `owner`: `OwnerMuon`, layout (a): each tensor's gradient reduced to its owner, updated there (state
  on the owner only), broadcast back;
- `all_to_all`: `AllToAllMuon`, layout (b): state in ZeRO's flat shards (`flat_layout`), the matrices'
  pieces sent to their owners by all-to-all and the orthogonalised pieces sent back;
- `newton_schulz`: Muon's update for one matrix as `torch.optim.Muon` computes it, cut into its
  element-wise parts and its whole-matrix part, and its FLOPs; `MuonSettings`, the hyper-parameters;
- `owners`: owners balanced by Newton-Schulz FLOPs (Graham's LPT rule), loads and imbalance;
- `split`: which parameters Muon takes (hidden linear weights) and which AdamW takes (the rest);
- `common`: the checks and steps both layouts share;
- `cost_model`: bytes per rank per step, Newton-Schulz FLOPs per rank, memory per rank beside ZeRO-1;
- `tensor_parallel`: a column-parallel weight's update, exact (gathered on the tp axis) or block-wise;
- `preconditioners`: Shampoo's and SOAP's preconditioner memory and communication when sharded;
- `parity`: both layouts against `torch.optim.Muon` + `torch.optim.AdamW` on one process;
- `figures`: when each layout wins, by width and world size.
"""

from distlab.memory.muon.all_to_all import AllToAllMuon
from distlab.memory.muon.newton_schulz import MuonSettings, newton_schulz_flops, zeropower_via_newtonschulz
from distlab.memory.muon.owner import OwnerMuon
from distlab.memory.muon.owners import greedy_owners, imbalance
from distlab.memory.muon.split import split_parameters

__all__ = ["AllToAllMuon", "MuonSettings", "OwnerMuon", "greedy_owners", "imbalance", "newton_schulz_flops",
           "split_parameters", "zeropower_via_newtonschulz"]
