"""Data: corpora, tokenizers, packing, SFT examples and synthetic recall tasks (grain).

Public API (the training and evaluation code call these):

    DataConfig                                   frozen config, DataConfig.from_dict
    make_train_iterator(cfg, process_index=, process_count=) -> grain.DatasetIterator
    make_train_dataset(cfg, ...) -> grain.IterDataset
    make_eval_batches(cfg, max_batches, process_index=, process_count=) -> list[dict]
    RecallTask, RecallExample, recall_task(cfg), examples_to_batch(...)
"""

from orthros_jax.data.config import DataConfig
from orthros_jax.data.corpus import Document, embedded_documents, load_documents, split_documents
from orthros_jax.data.pipeline import (
    make_eval_batches,
    make_train_dataset,
    make_train_iterator,
    tokenizer_for,
)
from orthros_jax.data.recall import RecallExample, RecallTask
from orthros_jax.data.sft import SFTExample, examples_to_batch, recall_task
from orthros_jax.data.tokenizers import ByteTokenizer, HFTokenizer, load_tokenizer

__all__ = [
    "ByteTokenizer",
    "DataConfig",
    "Document",
    "HFTokenizer",
    "RecallExample",
    "RecallTask",
    "SFTExample",
    "embedded_documents",
    "examples_to_batch",
    "load_documents",
    "load_tokenizer",
    "make_eval_batches",
    "make_train_dataset",
    "make_train_iterator",
    "recall_task",
    "split_documents",
    "tokenizer_for",
]
