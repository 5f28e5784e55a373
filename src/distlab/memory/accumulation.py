"""The old home of gradient accumulation, which issue 36 (item 5) split: the technique is
`distlab.memory.techniques.accumulation`, its measured peak `distlab.memory.measure.accumulation_peak`;
lab 7 imports the three names from here."""

from distlab.memory.measure.accumulation_peak import accumulation_peak
from distlab.memory.techniques.accumulation import accumulate_gradients, split_batch

__all__ = ["accumulate_gradients", "accumulation_peak", "split_batch"]
