"""Layers: what a layer kind is (kind.py), shared primitives (primitives.py), how to attend
(attend.py), one module per kind (attention.py, gdn.py), the registry (registry.py) and the
layer stack and its one loop (stack.py)."""
