"""Cluster profiles: the environment that CoreWeave's SUNK clusters want for NCCL, UCX and PMIx
(from CoreWeave's own SUNK scripts); ``sunk-gb200`` adds multi-node NVLink."""

from __future__ import annotations

PROFILES: dict[str, dict[str, str]] = {
    "sunk": {
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "ibp",
        "UCX_TLS": "tcp",
        "UCX_NET_DEVICES": "eth0",
        "PMIX_MCA_gds": "^ds12",
        "OMPI_MCA_coll_hcoll_enable": "0",
    },
}
PROFILES["sunk-gb200"] = {
    **PROFILES["sunk"],
    "NCCL_MNNVL_ENABLE": "1",
    "NCCL_CUMEM_ENABLE": "1",
    "NVIDIA_IMEX_CHANNELS": "0",
}
