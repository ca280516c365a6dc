"""SFT examples: answer masks, output positions, the docstring task and the recall tasks.

An SFT example is a token sequence plus a mask of its answer tokens. Position t predicts
token t+1, so the output copies (and loss terms) sit at every t with mask[t+1]: for a
prompt p and answer a that is t = len(p)-1 ... len(p)+len(a)-2. Tokens after the last
answer-predicting position feed nothing and are dropped, so a row needs
len(p)+len(a)-1 tokens and len(a) output copies.

The "docstring" task (default): from every `.py` document, each function with a
docstring gives

    prompt:  its `def` line(s), dedented, then '\\n    \"\"\"'
    answer:  the docstring's first line, stripped, then '\\n' (and EOS if the tokenizer has one)

It is learnable by a tiny byte model (the answers are short English with strong
regularities: "Return ...", names echoed from the signature) and is split by document,
like PT, so validation functions come from held-out files. Examples that do not fit
(prompt + answer - 1 > seq_len or answer > out_len) are skipped, and counted.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import textwrap
from collections.abc import Iterable

import numpy as np

from orthros_jax.data.config import DataConfig
from orthros_jax.data.corpus import Document, load_documents, split_documents
from orthros_jax.data.recall import RecallTask
from orthros_jax.data.tokenizers import Tokenizer, load_tokenizer

DOCSTRING_OPEN = '\n    """'
MAX_DOC_LINE_CHARS = 200  # longer first lines are prose paragraphs, not summaries


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """tokens [L] int32 and answer_mask [L] bool (True on tokens to be predicted)."""

    tokens: np.ndarray
    answer_mask: np.ndarray

    @classmethod
    def from_prompt_answer(cls, prompt: Iterable[int], answer: Iterable[int]) -> SFTExample:
        p, a = np.asarray(list(prompt), np.int32), np.asarray(list(answer), np.int32)
        mask = np.concatenate([np.zeros(len(p), bool), np.ones(len(a), bool)])
        return cls(np.concatenate([p, a]), mask)


def sft_element(tokens: np.ndarray, answer_mask: np.ndarray) -> dict[str, np.ndarray]:
    """The packable form of one example.

    Returns tokens [n] (through the last answer-predicting position), out_idx [m] (indices
    into tokens that predict an answer token) and targets [m] (the tokens they predict).
    """
    tokens = np.asarray(tokens, np.int32)
    answer_mask = np.asarray(answer_mask, bool)
    if answer_mask[0]:
        raise ValueError("an SFT example's first token cannot be an answer (nothing predicts it)")
    out_idx = np.nonzero(answer_mask[1:])[0].astype(np.int32)
    if len(out_idx) == 0:
        raise ValueError("an SFT example needs at least one answer token")
    n = int(out_idx[-1]) + 1
    return {"tokens": tokens[:n], "out_idx": out_idx, "targets": tokens[out_idx + 1]}


def fits(element: dict[str, np.ndarray], seq_len: int, out_len: int) -> bool:
    return len(element["tokens"]) <= seq_len and len(element["out_idx"]) <= out_len


_DEF_RE = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+[A-Za-z_]\w*[ \t]*\(")
_DOC_OPEN_RE = re.compile(r"^[ \t]+[rRuU]?(\"\"\"|\'\'\'|\"|\')(.*)$")
_MAX_SIGNATURE_LINES = 20


def _bracket_depth(line: str) -> int:
    code = line.split("#", 1)[0] if "'" not in line and '"' not in line else line
    return sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")


def _first_doc_line(lines: list[str], k: int) -> str:
    """First non-empty line of the docstring opening at lines[k] (quotes stripped)."""
    m = _DOC_OPEN_RE.match(lines[k])
    if not m:
        return ""
    quote, rest = m.group(1), m.group(2)
    if len(quote) == 1 and not rest.rstrip().endswith(quote):
        return ""  # a one-quote string continued with backslashes: too odd to bother
    if not rest.strip():  # '"""' alone on its line: the text starts on the next line
        nxt = lines[k + 1] if k + 1 < len(lines) else ""
        rest = "" if quote in nxt else nxt
    return rest.split(quote, 1)[0].strip()


def _is_one_def(signature: str) -> bool:
    """True when `signature` is exactly one def header (the scan can overrun a one-liner)."""
    try:
        body = ast.parse(signature + "\n    pass").body
    except (SyntaxError, ValueError):
        return False
    return (
        len(body) == 1
        and isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef))
        and len(body[0].body) == 1
        and isinstance(body[0].body[0], ast.Pass)
    )


def docstring_pairs(doc: Document) -> list[tuple[str, str]]:
    """(prompt, answer) text pairs of one Python document, in source order.

    A line scan (faster than `ast` over whole files: docs/data.md): a `def` header whose
    brackets close on a line ending in ':' and whose next line opens a string. Each
    header is checked with `ast.parse`, so every prompt is a real signature.
    """
    if not doc.id.endswith(".py"):
        return []
    lines = doc.text.splitlines()
    pairs = []
    for i, line in enumerate(lines):
        if not _DEF_RE.match(line):
            continue
        depth, j = 0, i
        while j < len(lines) and j < i + _MAX_SIGNATURE_LINES:
            depth += _bracket_depth(lines[j])
            if depth <= 0 and lines[j].split("#", 1)[0].rstrip().endswith(":"):
                break
            j += 1
        else:
            continue
        if j + 1 >= len(lines):
            continue
        first = _first_doc_line(lines, j + 1)
        if not first or len(first) > MAX_DOC_LINE_CHARS:
            continue
        signature = textwrap.dedent("\n".join(lines[i : j + 1])).rstrip()
        if not _is_one_def(signature):
            continue
        pairs.append((signature + DOCSTRING_OPEN, first + "\n"))
    return pairs


@functools.lru_cache(maxsize=8)
def docstring_elements(
    corpus: tuple[str, ...],
    include_tests: bool,
    text_field: str,
    tokenizer_path: str | None,
    validation_fraction: float,
    seq_len: int,
    out_len: int,
) -> tuple[tuple[dict[str, np.ndarray], ...], tuple[dict[str, np.ndarray], ...], int]:
    """(train elements, validation elements, number skipped as too long), cached per config."""
    tok = load_tokenizer(tokenizer_path)
    docs = load_documents(corpus, include_tests=include_tests, text_field=text_field)
    splits, skipped = [], 0
    for part in split_documents(docs, validation_fraction):
        seen: set[tuple[str, str]] = set()
        elements = []
        for doc in part:
            for prompt, answer in docstring_pairs(doc):
                if (prompt, answer) in seen:  # stdlib has duplicated helpers; keep one copy
                    continue
                seen.add((prompt, answer))
                ans = tok.encode(answer) + ([tok.eos_id] if tok.eos_id is not None else [])
                ex = SFTExample.from_prompt_answer(tok.encode(prompt), ans)
                element = sft_element(ex.tokens, ex.answer_mask)
                if fits(element, seq_len, out_len):
                    elements.append(element)
                else:
                    skipped += 1
        splits.append(tuple(elements))
    return splits[0], splits[1], skipped


def recall_task(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> RecallTask:
    """The RecallTask a config describes (sft_task "mqar" or "passkey"), shape-checked."""
    if cfg.sft_task not in ("mqar", "passkey"):
        raise ValueError(
            f"DataConfig.sft_task={cfg.sft_task!r} is not a recall task (mqar, passkey)"
        )
    task = RecallTask(
        tokenizer or load_tokenizer(cfg.tokenizer),
        cfg.sft_task,
        context_len=cfg.context_len,
        n_pairs=cfg.recall_pairs,
        n_queries=cfg.recall_queries,
        gap=cfg.recall_gap,
        filler=cfg.recall_filler,
        passkey_digits=cfg.recall_passkey_digits,
    )
    if task.answer_len() > cfg.out_len:
        raise ValueError(
            f"DataConfig.out_len={cfg.out_len} is smaller than the {cfg.sft_task} answer "
            f"({task.answer_len()} tokens); raise out_len or lower recall_queries"
        )
    return task


def recall_element(task: RecallTask, seed: int, index: int, stream: int) -> dict[str, np.ndarray]:
    """Packable element of generated example `index` (pure function of its arguments)."""
    ex = task.sample(seed, index, stream)
    return sft_element(ex.tokens, ex.answer_mask)


def examples_to_batch(
    examples: Iterable[SFTExample], seq_len: int, out_len: int
) -> dict[str, np.ndarray]:
    """One SFT batch with one example per row (no packing), for scoring fixed example sets.

    E.g. recall evaluation by teacher-forced argmax: a row is exactly right when
    argmax(logits[r, j]) == targets[r, j] for every j with loss_mask[r, j] == 1.
    Raises ValueError if an example does not fit [seq_len] / [out_len].
    """
    rows = [sft_element(ex.tokens, ex.answer_mask) for ex in examples]
    b = len(rows)
    batch = {
        "tokens": np.zeros((b, seq_len), np.int32),
        "positions": np.zeros((b, seq_len), np.int32),
        "segment_ids": np.zeros((b, seq_len), np.int32),
        "output_positions": np.zeros((b, out_len), np.int32),
        "targets": np.zeros((b, out_len), np.int32),
        "loss_mask": np.zeros((b, out_len), np.float32),
    }
    for r, el in enumerate(rows):
        if not fits(el, seq_len, out_len):
            raise ValueError(
                f"example {r} needs {len(el['tokens'])} tokens / {len(el['out_idx'])} outputs; "
                f"the batch has seq_len={seq_len}, out_len={out_len}"
            )
        n, m = len(el["tokens"]), len(el["out_idx"])
        batch["tokens"][r, :n] = el["tokens"]
        batch["positions"][r, :n] = np.arange(n)
        batch["segment_ids"][r, :n] = 1
        batch["output_positions"][r, :m] = el["out_idx"]
        batch["targets"][r, :m] = el["targets"]
        batch["loss_mask"][r, :m] = 1.0
    return batch
