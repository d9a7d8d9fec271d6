"""What the login side and the in-job runtime share: standard library only.

The sweep directory's layout, atomic files, trial states, Slurm array and time syntax, the
exit-code contract, override-syntax values, the launch/rendezvous formula and the cluster
profiles. Nothing here imports from ``slurmkit`` outside ``slurmkit.core``.
"""
