"""Layers: what a layer kind is (kind.py), shared primitives (primitives.py), how to attend
(attend.py) and where cached attention finds its keys (cache_view.py), one module per kind
(attention.py; the recurrent ones gdn.py, gla.py, retention.py, mamba2.py over recurrent.py's
skeleton), the FFN seam (ffn.py, moe.py), the registry of kinds (registry.py) and the layer
stack and its one loop (stack.py)."""
