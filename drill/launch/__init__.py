"""Launching a policy's drill as a batch job on the cluster's own engine: Slurm (submitted and
followed to its end) or Kubernetes (an indexed Job rendered for an admin to apply). drill never
starts ranks itself: srun or torchrun does, and every rank runs ``drill run``."""
