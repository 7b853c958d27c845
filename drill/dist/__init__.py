"""Distributed drills: one drill run by every rank of a job that torchrun, srun or a
Kubernetes indexed Job started. Each data file is read and hashed by exactly one rank; rank 0
gathers what every rank found, runs the checks and alone writes the record.

:mod:`~drill.dist.rendezvous` opens the store the ranks meet in (one connection per rank);
:mod:`~drill.dist.liveness` keeps heartbeats and names a rank that is lost;
:mod:`~drill.dist.context` joins the job (rank, world, collectives through the store);
:mod:`~drill.restore.partition` balances files across ranks by bytes;
:mod:`~drill.dist.restore` runs a rank's share and merges the reports on rank 0.
"""
