"""How long a prompt's KV takes from a prefill replica to a decode replica.

    time = setup latency + bytes / (link bandwidth * efficiency)

Bandwidths are per direction, per GPU, from the datasheets: NVLink 4 on H100
SXM (900 GB/s bidirectional), one InfiniBand NDR port per GPU (400 Gb/s),
PCIe Gen5 x16 (64 GB/s). Efficiency is what large RDMA reads reach in
practice; latency covers the NIXL handshake/notification round trip.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkSpec:
    name: str
    gb_per_s: float
    latency_s: float
    efficiency: float = 0.8

    def transfer_time(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / (self.gb_per_s * 1e9 * self.efficiency)


LINKS = {
    "nvlink": LinkSpec("NVLink 4 (H100 SXM)", 450.0, 20e-6),
    "infiniband": LinkSpec("InfiniBand NDR 400G", 50.0, 50e-6),
    "pcie": LinkSpec("PCIe Gen5 x16", 64.0, 30e-6, efficiency=0.7),
}
