"""Data pipelines: corpus split, PT packing and targets, SFT masks, determinism, resume,
sharding."""

from __future__ import annotations

import json
import random
import string

import grain
import numpy as np
import pytest

from orthros_jax.data import corpus, packing, pipeline, sft
from orthros_jax.data.config import DataConfig
from orthros_jax.data.tokenizers import ByteTokenizer, HFTokenizer

HOST = {"process_index": 0, "process_count": 1}


def _cfg(path: str, **kw) -> DataConfig:
    """A config over one corpus path; no validation split unless asked."""
    return DataConfig(corpus=(path,), **({"validation_fraction": 0.0} | kw))


def _same(xs, ys) -> bool:
    """Two lists of batches are equal, key by key."""
    return len(xs) == len(ys) and all(
        np.array_equal(x[k], y[k]) for x, y in zip(xs, ys, strict=True) for k in x
    )


def _write(tmp_path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def _ords(*rows: str) -> list[list[int]]:
    return [[ord(c) for c in row] for row in rows]


@pytest.fixture
def random_corpus(tmp_path):
    """40 documents of distinct random text (5..60 chars) in one jsonl file; returns
    (path, texts)."""
    rng = random.Random(0)
    texts = [
        f"<{i:02d}>" + "".join(rng.choices(string.ascii_lowercase + " ", k=rng.randint(1, 56)))
        for i in range(40)
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    return str(path), texts


def _segments(batch, row):
    """[(tokens + final target)] per segment of a PT row, as bytes."""
    seg = batch["segment_ids"][row]
    out = []
    for s in range(1, int(seg.max(initial=0)) + 1):
        idx = np.nonzero(seg == s)[0]
        assert np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))), "segment not contiguous"
        assert np.array_equal(batch["positions"][row, idx], np.arange(len(idx))), "positions reset"
        toks = batch["tokens"][row, idx]
        # Inside a segment, each target is the next token; the last one is the document's next.
        assert np.array_equal(batch["targets"][row, idx[:-1]], toks[1:])
        out.append(bytes(list(toks) + [int(batch["targets"][row, idx[-1]])]))
    return out


def _contents(batches) -> list[bytes]:
    return [s for b in batches for r in range(b["tokens"].shape[0]) for s in _segments(b, r)]


# ---------------------------------------------------------------- corpus and split


@pytest.mark.slow
def test_embedded_corpus_is_stdlib_plus_pydoc():
    docs = corpus.embedded_documents(True)
    ids = [d.id for d in docs]
    assert len(docs) > 1000 and ids[0].startswith("stdlib/") and ids[-1].startswith("pydoc/")
    assert "stdlib/functools.py" in ids and "pydoc/if" in ids
    stdlib_ids = [i for i in ids if i.startswith("stdlib/")]
    assert stdlib_ids == sorted(stdlib_ids) and not any("site-packages" in i for i in ids)
    no_tests = [d.id for d in corpus.embedded_documents(False)]
    assert 0 < len(no_tests) < len(docs) and not any("/test/" in i for i in no_tests)


def test_split_is_by_document_id_and_disjoint(random_corpus):
    path, texts = random_corpus
    docs = corpus.load_documents((path,))
    assert [d.text for d in docs] == texts  # file order kept
    train, val = corpus.split_documents(docs, 0.25)
    assert {d.id for d in train}.isdisjoint(d.id for d in val)
    assert len(train) + len(val) == len(docs) and 0 < len(val) < len(docs)
    # The split is a function of the id alone: order and company do not matter.
    assert {d.id for d in corpus.split_documents(docs[::-1], 0.25)[1]} == {d.id for d in val}
    assert all(corpus.is_validation(d.id, 0.25) for d in val)


def test_file_documents_jsonl_and_text(tmp_path):
    jl = _write(tmp_path, "x.jsonl", '{"text": "a"}\n\n{"text": ""}\n{"body": "b", "text": "c"}\n')
    docs = corpus.file_documents(jl)
    assert [(d.id.rsplit(":", 1)[1], d.text) for d in docs] == [("1", "a"), ("4", "c")]
    with pytest.raises(ValueError, match="'body'"):
        corpus.file_documents(_write(tmp_path, "y.jsonl", '{"text": "a"}\n'), text_field="body")
    assert corpus.file_documents(_write(tmp_path, "z.txt", "hi"))[0].text == "hi"


# ---------------------------------------------------------------- PT packing


def test_pt_batch_exact_arrays(tmp_path):
    """Hand-made corpus, no shuffle: explicit expected rows (first-fit, 2 bins of T=8)."""
    _write(tmp_path, "a.txt", "abcdef")  # 5 pairs
    _write(tmp_path, "b.txt", "XYZ")  # 2 pairs
    _write(tmp_path, "c.txt", "0123456789")  # 9 pairs -> chunks of 8 and 1
    cfg = _cfg(str(tmp_path), seq_len=8, batch_size=2, shuffle=False)
    batch = next(pipeline.make_train_iterator(cfg, **HOST))
    assert batch["tokens"].tolist() == _ords("abcdeXY8", "01234567")
    assert batch["targets"].tolist() == _ords("bcdefYZ9", "12345678")
    assert batch["segment_ids"].tolist() == [[1, 1, 1, 1, 1, 2, 2, 3], [1] * 8]
    assert batch["positions"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 0], list(range(8))]
    assert batch["loss_mask"].tolist() == [[1.0] * 8, [1.0] * 8]
    assert batch["loss_mask"].dtype == np.float32 and batch["tokens"].dtype == np.int32


def test_pt_padding_has_no_loss(tmp_path):
    _write(tmp_path, "a.txt", "abcd")  # 3 pairs; the next epoch's copy does not fit in T=5
    cfg = _cfg(str(tmp_path), seq_len=5, batch_size=1, shuffle=False)
    batch = next(pipeline.make_train_iterator(cfg, **HOST))
    assert batch["tokens"].tolist() == [[97, 98, 99, 0, 0]]
    assert batch["targets"].tolist() == [[98, 99, 100, 0, 0]]
    assert batch["segment_ids"].tolist() == batch["loss_mask"].tolist() == [[1, 1, 1, 0, 0]]


def test_pt_eos_appended_with_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok_path = str(tmp_path / "tokenizer.json")
    tok.save(tok_path)
    assert HFTokenizer(tok_path).eos_id == 1
    cfg = _cfg(
        _write(tmp_path, "a.txt", "hello world"), tokenizer=tok_path, seq_len=3, batch_size=1
    )
    batch = next(pipeline.make_train_iterator(cfg, **HOST))
    assert batch["tokens"].tolist() == [[2, 3, 0]]
    assert batch["targets"].tolist() == [[3, 1, 0]]  # the last word predicts EOS
    assert batch["loss_mask"].tolist() == [[1, 1, 0]]


def test_pt_segments_never_cross_documents(random_corpus):
    path, texts = random_corpus
    cfg = _cfg(path, seq_len=16, batch_size=4, seed=3)
    it = pipeline.make_train_iterator(cfg, **HOST)
    batches = [next(it) for _ in range(60)]
    for b in batches:
        assert b["tokens"].shape == (4, 16)
        pad = b["segment_ids"] == 0
        assert (b["loss_mask"][pad] == 0).all() and (b["loss_mask"][~pad] == 1).all()
    contents = _contents(batches)
    # Every segment (its tokens and last target) is a contiguous piece of one document.
    assert all(any(c.decode() in t for t in texts) for c in contents)
    # And 60 batches of ~4 docs' worth cover every document (repeat + shuffle).
    assert all(any(t.startswith(c.decode()) for c in contents) for t in texts if len(t) > 1)


def test_pt_deterministic_by_seed_and_different_across_seeds(random_corpus):
    path, _ = random_corpus

    def first(seed, n=4):
        cfg = _cfg(path, seq_len=16, batch_size=4, seed=seed)
        it = pipeline.make_train_iterator(cfg, **HOST)
        return [next(it)["tokens"] for _ in range(n)]

    a, b, c = first(1), first(1), first(2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_train_and_validation_disjoint(random_corpus):
    path, texts = random_corpus
    cfg = _cfg(path, seq_len=16, batch_size=4, validation_fraction=0.3)
    it = pipeline.make_train_iterator(cfg, **HOST)
    evals = pipeline.make_eval_batches(cfg, **HOST)
    # Documents start with a unique "<NN>" tag, which their first chunk carries.
    train_docs = {c[:4] for c in _contents([next(it) for _ in range(20)]) if c.startswith(b"<")}
    val_docs = {c[:4] for c in _contents(evals) if c.startswith(b"<")}
    assert val_docs and train_docs and val_docs.isdisjoint(train_docs)
    # Eval is the same every time, whatever the seed, and covers the whole split.
    again = pipeline.make_eval_batches(cfg.replace(seed=9), **HOST)
    assert _same(evals, again)
    held = [t for t in texts if corpus.is_validation(f"{path}:{texts.index(t) + 1}", 0.3)]
    assert {t[:4].encode() for t in held} == val_docs
    assert evals[-1]["tokens"].shape == (4, 16)  # last batch padded to full size


def test_iterator_state_resumes_exactly(random_corpus, tmp_path):
    path, _ = random_corpus
    cfg = _cfg(path, seq_len=16, batch_size=2, seed=5)
    it = pipeline.make_train_iterator(cfg, **HOST)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # must survive a JSON round trip
    # Save through grain's orbax checkpoint handler too (what checkpoint.py uses).
    from etils import epath

    handler, ckpt = grain.checkpoint.CheckpointHandler(), epath.Path(tmp_path)
    handler.save(ckpt, item=it)
    expected = [next(it) for _ in range(5)]
    fresh = pipeline.make_train_iterator(cfg, **HOST)
    fresh.set_state(state)
    assert _same(expected, [next(fresh) for _ in range(5)])
    restored = handler.restore(ckpt, item=pipeline.make_train_iterator(cfg, **HOST))
    assert _same(expected, [next(restored) for _ in range(5)])


def test_per_host_sharding_is_disjoint(random_corpus):
    path, _ = random_corpus
    cfg = _cfg(path, seq_len=64, batch_size=4, seed=1)
    hosts = [pipeline.make_train_iterator(cfg, process_index=i, process_count=2) for i in range(2)]
    batches = [next(it) for it in hosts]
    assert all(b["tokens"].shape == (2, 64) for b in batches)  # per-host batch
    seen = [{c[:4] for c in _contents([b])} for b in batches]
    # 40 documents of <= 60 chars, one chunk each: 2 rows per host stay inside one epoch.
    assert seen[0] and seen[1] and seen[0].isdisjoint(seen[1])
    # Eval: same batch count per host, disjoint rows, together the single-host batches.
    cfg_v = cfg.replace(validation_fraction=0.5)
    one = pipeline.make_eval_batches(cfg_v, process_index=0, process_count=1)
    parts = [pipeline.make_eval_batches(cfg_v, process_index=i, process_count=2) for i in range(2)]
    assert len(parts[0]) == len(parts[1]) == len(one)
    joined = [
        {k: np.concatenate([p0[k], p1[k]]) for k in p0} for p0, p1 in zip(*parts, strict=True)
    ]
    assert _same(one, joined)
    with pytest.raises(ValueError, match="batch_size"):
        pipeline.make_train_iterator(cfg, process_index=0, process_count=3)


def test_chunking_long_document_covers_every_pair():
    doc = np.arange(20, dtype=np.uint8)
    chunks = pipeline.chunk_documents([doc, np.array([7], np.uint8)], seq_len=8)
    assert chunks.lengths.tolist() == [8, 8, 3]  # 19 pairs; the 1-token doc has none
    els = [chunks[i] for i in range(len(chunks))]
    assert np.concatenate([e["tokens"] for e in els]).tolist() == list(range(19))
    assert np.concatenate([e["targets"] for e in els]).tolist() == list(range(1, 20))


# ---------------------------------------------------------------- SFT


def _pack_sft(elements, seq_len, out_len, rows):
    ds = grain.MapDataset.source(elements).to_iter_dataset()
    ds = packing.pack(
        ds, "sft", seq_len=seq_len, out_len=out_len, num_bins=rows, seed=0, shuffle_bins=False
    )
    return packing.finalize_sft(next(iter(ds.batch(rows))))


def test_sft_element_and_packed_arrays():
    """Prompt p, answer a: outputs at len(p)-1 .. len(p)+len(a)-2, explicit packed arrays."""
    ex1 = sft.SFTExample.from_prompt_answer([1, 2, 3], [4, 5])
    ex2 = sft.SFTExample.from_prompt_answer([6, 7], [8])
    el1 = sft.sft_element(ex1.tokens, ex1.answer_mask)
    assert el1["tokens"].tolist() == [1, 2, 3, 4]  # the last answer token predicts nothing
    assert el1["out_idx"].tolist() == [2, 3] and el1["targets"].tolist() == [4, 5]
    el2 = sft.sft_element(ex2.tokens, ex2.answer_mask)
    batch = _pack_sft([el1, el2], seq_len=8, out_len=4, rows=1)
    assert batch["tokens"].tolist() == [[1, 2, 3, 4, 6, 7, 0, 0]]
    assert batch["segment_ids"].tolist() == [[1, 1, 1, 1, 2, 2, 0, 0]]
    assert batch["positions"].tolist() == [[0, 1, 2, 3, 0, 1, 0, 0]]
    assert batch["output_positions"].tolist() == [[2, 3, 5, 0]]
    assert batch["targets"].tolist() == [[4, 5, 8, 0]]
    assert batch["loss_mask"].tolist() == [[1.0, 1.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="answer"):
        sft.sft_element(np.array([1, 2]), np.array([False, False]))


def test_sft_out_len_caps_a_row():
    """Outputs have their own capacity: a third example overflows T_out=4, not T, so it opens
    a row."""
    els = []
    for p, a in [([1], [2, 3]), ([4], [5, 6]), ([7], [8])]:
        ex = sft.SFTExample.from_prompt_answer(p, a)
        els.append(sft.sft_element(ex.tokens, ex.answer_mask))
    batch = _pack_sft(els, seq_len=16, out_len=4, rows=2)
    assert batch["tokens"][:, :4].tolist() == [[1, 2, 4, 5], [7, 0, 0, 0]]
    assert batch["output_positions"].tolist() == [[0, 1, 2, 3], [0, 0, 0, 0]]
    assert batch["targets"].tolist() == [[2, 3, 5, 6], [8, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]


PY_SOURCE = '''
import x


def add(a, b=(1, 2)):
    """Add two numbers.

    More text.
    """
    return a + b


class K:
    async def fetch(self,
                    url: str) -> bytes:  # multi-line signature
        """
        Fetch a URL.
        """

    def bare(self):
        return 1

    def one(self): "one-liner: skipped"
'''


def test_docstring_task_pairs(tmp_path):
    pairs = sft.docstring_pairs(corpus.Document("m.py", PY_SOURCE))
    assert pairs == [
        ('def add(a, b=(1, 2)):\n    """', "Add two numbers.\n"),
        (
            "async def fetch(self,\n                url: str) -> bytes:"
            '  # multi-line signature\n    """',
            "Fetch a URL.\n",
        ),
    ]
    assert sft.docstring_pairs(corpus.Document("m.txt", PY_SOURCE)) == []


def test_sft_pipeline_loss_only_on_answers(tmp_path):
    _write(tmp_path, "m.py", PY_SOURCE * 3)  # duplicates are dropped: 2 examples
    cfg = _cfg(str(tmp_path), kind="sft", seq_len=128, out_len=32, batch_size=2, shuffle=False)
    it = pipeline.make_train_iterator(cfg, **HOST)
    tok = ByteTokenizer()
    answers = set()
    for _ in range(2):
        batch = next(it)
        for r in range(2):
            m = batch["loss_mask"][r] > 0
            pos, tgt = batch["output_positions"][r][m], batch["targets"][r][m]
            assert (batch["output_positions"][r][~m] == 0).all()
            assert (batch["targets"][r][~m] == 0).all()
            seg = batch["segment_ids"][r]
            for s in np.unique(seg[pos]):
                sel = seg[pos] == s
                p_s, t_s = pos[sel], tgt[sel]
                # Consecutive positions; each predicts the token after it when that is in the row.
                assert np.array_equal(p_s, np.arange(p_s[0], p_s[0] + len(p_s)))
                assert np.array_equal(batch["tokens"][r, p_s[1:]], t_s[:-1])
                # The segment ends at the last output; the first output is the prompt's last
                # token (the opening quotes).
                assert p_s[-1] == np.nonzero(seg == s)[0][-1]
                assert tok.decode(batch["tokens"][r, p_s[0] - 2 : p_s[0] + 1].tolist()) == '"""'
                answers.add(tok.decode(t_s.tolist()))
    assert answers == {"Add two numbers.\n", "Fetch a URL.\n"}
    too_small = cfg.replace(out_len=8)  # both answers are longer: skipped -> empty split
    with pytest.raises(ValueError, match="no docstring examples"):
        pipeline.make_train_iterator(too_small, **HOST)


# ---------------------------------------------------------------- config


BAD_FIELDS = [
    ("kind", "rl"), ("seq_len", 0), ("out_len", -1), ("batch_size", 2.5),
    ("validation_fraction", 1.0), ("seed", -1), ("seed", 2**32), ("shuffle", "yes"),
    ("sft_task", "poetry"), ("recall_filler", "noise"), ("recall_queries", 99),
    ("recall_context", 10_000), ("tokenizer", "/nonexistent/tokenizer.json"), ("corpus", ()),
]  # fmt: skip


@pytest.mark.parametrize("field, value", BAD_FIELDS)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DataConfig(**{field: value})


def test_from_dict_rejects_unknown_keys_listing_valid_ones():
    with pytest.raises(ValueError, match=r"seq_lenn.*valid fields:.*seq_len"):
        DataConfig.from_dict({"seq_lenn": 3})
    cfg = DataConfig.from_dict({"corpus": ["a.txt", "b.txt"], "seq_len": 32})
    assert cfg.corpus == ("a.txt", "b.txt")
    assert DataConfig(corpus="embedded,x.txt").corpus == ("embedded", "x.txt")
    assert DataConfig.from_dict(cfg.to_dict()) == cfg


def test_missing_corpus_path_is_a_clear_error(tmp_path):
    cfg = DataConfig(corpus=(str(tmp_path / "nope*.txt"),))
    with pytest.raises(ValueError, match="matches no file"):
        pipeline.make_train_iterator(cfg, **HOST)
