"""Chapter 8: the hardware underneath -- PCIe, NVLink, NVSwitch, InfiniBand/RDMA.

One idea per file:
- the specifications as data (PCIe, NVLink, NVSwitch generations, GPUs, servers, InfiniBand rates), each
  row with its source, live on the ground floor in `distlab.catalog`, because other chapters read them too.
- `probe`: what this machine has (GPUs, interconnect matrix, PCIe links, RDMA ports, NUMA nodes);
  `distlab doctor` uses it. A sub-package: `probe.report` puts together its GPU probes (`probe.gpus`)
  and its sysfs/procfs readers (`probe.host`).
- `bench`: host, host-device, device, peer-to-peer and collective bandwidth, each beside the catalog's
  figure (`python -m distlab.hardware --out FILE.json`).
- `topology`: topologies as graphs (servers from the catalog, clusters of them), on the ground floor in
  `distlab.topology` (chapters 6, 9 and 11 price traffic on them; this name re-exports them), and the hops
  of rings on them and a ring's bottleneck in `distlab.ring_hops`; `cost_model`: the predicted all-reduce
  time of a flat ring, a two-level ring and a tree on them.
- `exercises`: checks that diagnose unit and factor mistakes; `figures`: the book's pictures and the
  ipywidgets explorer.

Importing this package imports neither torch nor matplotlib (`distlab doctor` must run without them).
"""

from distlab.hardware import probe

__all__ = ["probe"]
