"""orthros-jax: the Orthros dual-stream Transformer and its baselines in JAX/Flax.

Importing the package registers the layer kinds and attention implementations with the config
(orthros_jax.layers.registry), so `ModelConfig` knows every kind whatever is imported first.
"""

from orthros_jax.layers import registry as _registry  # noqa: F401
