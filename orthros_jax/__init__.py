"""orthros-jax: the Orthros dual-stream Transformer and its baselines in JAX/Flax.

Importing the package (or orthros_jax.config) registers nothing and imports no model code: a
ModelConfig is a plain value, checked against the layer registry (layers/registry.validate)
where a model is built.
"""
