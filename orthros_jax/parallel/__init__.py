"""Parallelism: the mesh and logical-axis rules, and the shardings of params, train state and
cache (sharding.py)."""
