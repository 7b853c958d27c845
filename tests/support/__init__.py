"""Helpers the tests share: real servers (S3, radosgw, Slurm, a Kubernetes API), real trainers
and rank programs, fault injection and replay targets. No tests here."""
