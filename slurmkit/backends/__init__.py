"""Where trials run: :mod:`.slurm` (sbatch/squeue/sacct/scancel) and :mod:`.local`."""
