"""Cluster profiles: the environment CoreWeave's SUNK clusters want for NCCL, UCX and PMIx, as
data, each value beside where it comes from: CoreWeave's public Slurm scripts in
coreweave/nccl-tests (``slurm/``). ``sunk-gb200`` adds multi-node NVLink for GB200 NVL72 racks
(the ``gb200-nvl72-enroot`` script)."""

from __future__ import annotations

NCCL_TESTS = "coreweave/nccl-tests Slurm scripts"
GB200 = "coreweave/nccl-tests gb200-nvl72-enroot"

# name -> {variable: (value, where it comes from)}
SOURCES: dict[str, dict[str, tuple[str, str]]] = {
    "sunk": {
        "NCCL_SOCKET_IFNAME": ("eth0", NCCL_TESTS),
        "NCCL_IB_HCA": ("ibp", NCCL_TESTS),
        "NCCL_NET_PLUGIN": ("none", f"11 of the 14 {NCCL_TESTS}"),
        "UCX_TLS": ("tcp", NCCL_TESTS),
        "UCX_NET_DEVICES": ("eth0", NCCL_TESTS),
        "PMIX_MCA_gds": ("^ds12", NCCL_TESTS),
        "OMPI_MCA_coll_hcoll_enable": ("0", NCCL_TESTS),
    },
}
SOURCES["sunk-gb200"] = {
    **SOURCES["sunk"],
    "NCCL_MNNVL_ENABLE": ("1", GB200),
    "NCCL_CUMEM_ENABLE": ("1", GB200),
    "NCCL_NET_GDR_C2C": ("1", GB200),
    "NCCL_SHM_DISABLE": ("0", GB200),
    "NVIDIA_IMEX_CHANNELS": ("0", GB200),
}

# name -> {variable: value}: what a profile puts in a spec's env
PROFILES: dict[str, dict[str, str]] = {
    name: {var: value for var, (value, _) in env.items()} for name, env in SOURCES.items()
}
