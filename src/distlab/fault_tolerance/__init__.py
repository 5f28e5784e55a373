"""Chapter 11: training that survives failures and slow links.

HSDP on the mesh, replica groups that agree on a quorum every step and heal from a live peer, and the
methods that communicate every H steps instead of every step (local SGD, DiLoCo, streaming DiLoCo),
checked against torchft.
"""
