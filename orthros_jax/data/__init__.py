"""Data: corpora, tokenizers, packing, SFT examples and synthetic recall tasks (grain)."""
