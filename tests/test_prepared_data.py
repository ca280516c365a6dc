"""Prepared datasets: prepare (formats, EOS, dtype, determinism, resume, bad input), lazy reads
equal to the in-memory pipeline, per-host reads disjoint and complete (mixtures:
test_prepared_mixture.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import string
import subprocess
import sys

import numpy as np
import pytest

from orthros_jax.data import corpus, pipeline, prepare, prepared
from orthros_jax.data.config import DataConfig

HOST = {"process_index": 0, "process_count": 1}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_prepare(inputs, out, tokenizer=None, *, field="text", skip=False, shard_bytes=2000):
    """What launch/prepare_data.py does, in this process, one shard after another."""
    plan = prepare.make_plan(
        corpus.expand_corpus(inputs),
        tokenizer,
        text_field=field,
        skip_bad=skip,
        shard_bytes=shard_bytes,
    )
    prepare.check_plan(str(out), plan)
    prepare.remove_temporaries(str(out))
    records = [prepare.prepare_shard(str(out), i, plan) for i in range(len(plan["shards"]))]
    return prepare.write_manifest(str(out), plan, records)


def _texts(seed: int, n: int, prefix: str = "") -> list[str]:
    rng = random.Random(seed)
    return [
        f"{prefix}<{i:03d}>"
        + "".join(rng.choices(string.ascii_lowercase + " ", k=rng.randint(0, 90)))
        for i in range(n)
    ]


def _jsonl(path, texts, field="text") -> str:
    path.write_text("".join(json.dumps({field: t}) + "\n" for t in texts))
    return str(path)


@pytest.fixture
def docs(tmp_path):
    """120 random documents in one .jsonl: (path, texts)."""
    texts = _texts(0, 120)
    return _jsonl(tmp_path / "docs.jsonl", texts), texts


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A 300-id BPE tokenizer.json with <|endoftext|>, trained here."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_texts(1, 200), trainer)
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    tok.save(path)
    return path


def _decode_all(out) -> list[list[int]]:
    """Every document's ids, in order, straight from the shard files."""
    manifest = json.loads((out / "manifest.json").read_text())
    docs = []
    for shard in manifest["shards"]:
        ids = np.fromfile(out / f"{shard['name']}.bin", manifest["dtype"])
        ends = np.load(out / f"{shard['name']}.docs.npy")["end"]
        docs += [ids[a:b].tolist() for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    return docs


def _same(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


# ---------------------------------------------------------------- prepare


def test_token_dtype_is_the_smallest_that_holds_the_vocab():
    got = [prepare.token_dtype(v).name for v in (256, 257, 65536, 65537, 128256)]
    assert got == ["uint8", "uint16", "uint16", "uint32", "uint32"]


def test_prepare_reads_jsonl_txt_parquet_directories_and_globs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    _jsonl(src / "a.jsonl", ["first", "", "second"], field="body")
    (src / "b.txt").write_text("a whole text file\nof two lines\n")
    pq.write_table(pa.table({"body": ["row one", None, "row three"]}), src / "c.parquet")
    (src / "sub" / "d.txt").write_text("nested")
    (tmp_path / "e.jsonl").write_text(json.dumps({"body": "by glob"}) + "\n")
    with pytest.raises(ValueError, match=r"c\.parquet:2 column 'body' is None"):
        run_prepare([str(src)], tmp_path / "stop", field="body")
    m = run_prepare(
        [str(src), str(tmp_path / "*.jsonl")], tmp_path / "out", field="body", skip=True
    )
    texts = ["first", "second", "a whole text file\nof two lines\n", "row one", "row three"]
    texts += ["nested", "by glob"]
    assert [bytes(d).decode() for d in _decode_all(tmp_path / "out")] == texts
    assert (m["documents"], m["skipped"], m["dtype"]) == (7, 1, "uint8")
    assert [s["path"] for s in m["sources"]] == sorted(
        str(p) for p in (src / "a.jsonl", src / "b.txt", src / "c.parquet", src / "sub" / "d.txt")
    ) + [str(tmp_path / "e.jsonl")]


def test_prepare_with_a_tokenizer_json_appends_eos_in_uint16(tmp_path, docs, bpe):
    from tokenizers import Tokenizer

    path, texts = docs
    m = run_prepare([path], tmp_path / "out", bpe)
    tok = Tokenizer.from_file(bpe)
    eos = tok.token_to_id("<|endoftext|>")
    want = [tok.encode(t, add_special_tokens=False).ids + [eos] for t in texts]
    assert _decode_all(tmp_path / "out") == want
    assert m["dtype"] == "uint16" and m["tokenizer"]["eos_id"] == eos
    assert m["tokenizer"]["sha256"] == prepare.file_sha256(bpe) and len(m["shards"]) > 1
    assert m["tokens"] == sum(map(len, want)) == sum(s["tokens"] for s in m["shards"])


def test_big_jsonl_is_cut_at_line_starts_with_its_line_numbers(tmp_path, docs):
    path, texts = docs
    plan = prepare.plan_shards([path], 1500)
    assert len(plan) > 3 and all(len(s) == 1 for s in plan)
    data = open(path, "rb").read()
    for piece in (s[0] for s in plan):
        assert piece["start"] == 0 or data[piece["start"] - 1 : piece["start"]] == b"\n"
        assert piece["line"] == data[: piece["start"]].count(b"\n") + 1
    assert plan[-1][0]["end"] == len(data)


def test_killed_preparation_resumes_to_the_same_bytes(tmp_path, docs):
    path, _ = docs
    run_prepare([path], tmp_path / "whole")
    out = tmp_path / "killed"
    plan = prepare.make_plan([path], None, text_field="text", skip_bad=False, shard_bytes=2000)
    prepare.check_plan(str(out), plan)
    prepare.prepare_shard(str(out), 0, plan)
    done_at = os.stat(out / "shard_00000.bin").st_mtime_ns

    def die(*_):
        raise KeyboardInterrupt  # a kill after the shard's first batch of text was written

    with pytest.raises(KeyboardInterrupt):
        prepare.prepare_shard(str(out), 1, plan, progress=die)
    left = sorted(os.listdir(out))
    assert "shard_00001.bin" not in left and any(".tmp" in n for n in left)
    assert prepare.shard_done(str(out), 1) is None
    with pytest.raises(ValueError, match="has no manifest.json"):
        prepared.load_manifest(str(out), None)  # training refuses the unfinished dataset
    run_prepare([path], out)
    assert os.stat(out / "shard_00000.bin").st_mtime_ns == done_at  # not redone
    names = sorted(os.listdir(tmp_path / "whole"))
    assert names == sorted(os.listdir(out))  # temporaries gone
    for name in names:
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_resume_with_other_inputs_is_refused(tmp_path, docs, bpe):
    path, _ = docs
    run_prepare([path], tmp_path / "out")
    with pytest.raises(ValueError, match="holds a preparation with other .*tokenizer"):
        run_prepare([path], tmp_path / "out", bpe)


@pytest.mark.parametrize(
    "line, why",
    [("{not json", "is not valid UTF-8 JSON"), ('{"body": 1}', "has no string 'text' field")],
)
def test_bad_input_line_stops_naming_file_and_line_or_is_skipped(tmp_path, line, why):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n' + line + '\n{"text": "after"}\n')
    with pytest.raises(ValueError, match=f"bad.jsonl:3 {why}"):
        run_prepare([str(path)], tmp_path / "stop")
    m = run_prepare([str(path)], tmp_path / "skip", skip=True)
    assert (m["documents"], m["skipped"]) == (2, 1)
    assert m["shards"][0]["skipped_lines"][0].startswith(f"{path}:3 {why}")


@pytest.mark.slow
def test_cli_with_two_processes_writes_the_same_bytes(tmp_path, docs):
    path, _ = docs
    run_prepare([path], tmp_path / "serial")
    cmd = [
        sys.executable,
        "launch/prepare_data.py",
        f"--input={path}",
        f"--output={tmp_path / 'cli'}",
        "--shard_mb=0.002",
        "--processes=2",
        "--progress=false",
    ]
    env = dict(os.environ, PYTHONPATH=REPO)
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "prepared 120 documents" in first.stdout and "(0 resumed)" in first.stdout
    for name in os.listdir(tmp_path / "serial"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    n = len(json.loads((tmp_path / "cli" / "manifest.json").read_text())["shards"])
    assert again.returncode == 0 and f"({n} resumed)" in again.stdout


# ---------------------------------------------------------------- training reads


def _cfgs(path, out, **kw):
    base = dict(seq_len=32, batch_size=4, validation_fraction=0.2, seed=3) | kw
    return DataConfig(corpus=(path,), **base), DataConfig(prepared=(str(out),), **base)


@pytest.mark.parametrize("tokenized", [False, True], ids=["bytes", "bpe"])
def test_prepared_batches_equal_the_in_memory_pipeline(tmp_path, docs, bpe, tokenized):
    path, _ = docs
    tok = bpe if tokenized else None
    run_prepare([path], tmp_path / "out", tok)
    raw, prep = _cfgs(path, tmp_path / "out", tokenizer=tok)
    a = pipeline.make_train_iterator(raw, **HOST)
    b = pipeline.make_train_iterator(prep, **HOST)
    _same([next(a) for _ in range(40)], [next(b) for _ in range(40)])  # > 1 epoch
    evals = pipeline.make_eval_batches(prep, **HOST)
    assert evals and evals[0]["loss_mask"].sum() > 0
    _same(pipeline.make_eval_batches(raw, **HOST), evals)  # validation split by document
    index_files = os.listdir(tmp_path / "out" / prepared.INDEX_DIR)
    assert len(index_files) == 2  # train and validation chunk tables, cached
    again = prepared.open_split(str(tmp_path / "out"), tok, 32, 0.2, "train")[0]
    assert again.index.file is not None  # the cached table is read from its file, not rebuilt


def test_hosts_read_disjoint_and_complete_parts(tmp_path, monkeypatch):
    path = _jsonl(tmp_path / "many.jsonl", _texts(5, 600))
    run_prepare([path], tmp_path / "out", shard_bytes=8000)
    cfg = DataConfig(prepared=(str(tmp_path / "out"),), seq_len=32, batch_size=6, seed=1)
    n = len(prepared.open_split(str(tmp_path / "out"), None, 32, 0.05, "train")[0])
    reads: list[tuple[int, int]] = []  # (host that opened the source, chunk index)
    host = [0]
    init, getitem = prepared.PreparedChunks.__init__, prepared.PreparedChunks.__getitem__

    def tagged_init(self, *args):
        init(self, *args)
        self.host = host[0]

    monkeypatch.setattr(prepared.PreparedChunks, "__init__", tagged_init)
    monkeypatch.setattr(
        prepared.PreparedChunks,
        "__getitem__",
        lambda s, i: reads.append((s.host, i)) or getitem(s, i),
    )

    def read_by(pi: int) -> list[int]:
        return [i for h, i in reads if h == pi]

    parts = []
    for pi in range(3):  # one epoch of each host's share, element by element
        host[0] = pi
        ds = pipeline.train_elements(cfg, pi, 3)
        for j in range(len(range(pi, n, 3))):
            ds[j]
        parts.append(set(read_by(pi)))
        assert len(read_by(pi)) == len(parts[-1])
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert set.union(*parts) == set(range(n)) and n > 600
    reads.clear()
    for pi in range(3):  # the iterator (threads, prefetch) reads nothing of the others' parts
        host[0] = pi
        it = pipeline.make_train_iterator(cfg, process_index=pi, process_count=3)
        for _ in range(4):
            next(it)
    for pi in range(3):
        got = read_by(pi)
        assert got and set(got) <= parts[pi] and len(got) == len(set(got))


def test_bad_prepared_inputs_are_one_line_errors(tmp_path, docs, bpe):
    path, _ = docs
    out = tmp_path / "out"
    run_prepare([path], out)
    cfg = DataConfig(prepared=(str(out),), seq_len=32, batch_size=4)
    with pytest.raises(ValueError, match=r"tokenized with bytes .* DataConfig.tokenizer="):
        pipeline.make_train_iterator(cfg.replace(tokenizer=bpe), **HOST)
    with pytest.raises(ValueError, match="has no manifest.json"):
        pipeline.make_train_iterator(cfg.replace(prepared=(str(tmp_path),)), **HOST)
    docs_file = out / "shard_00001.docs.npy"
    saved = docs_file.read_bytes()
    docs_file.write_bytes(saved[:-16])
    with pytest.raises(ValueError, match=r"shard_00001.docs.npy is unreadable or truncated"):
        pipeline.make_train_iterator(cfg, **HOST)
    docs_file.write_bytes((out / "shard_00000.docs.npy").read_bytes())  # another shard's
    with pytest.raises(ValueError, match=r"shard_00001.docs.npy holds .* truncated or stale"):
        pipeline.make_train_iterator(cfg, **HOST)
    docs_file.write_bytes(saved)
    bin_file = out / "shard_00002.bin"
    bin_file.write_bytes(bin_file.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"shard_00002.bin has \d+ bytes but .* truncated"):
        pipeline.make_train_iterator(cfg, **HOST)
    bin_file.unlink()
    with pytest.raises(ValueError, match=r"shard_00002.bin \(listed in .*\) is missing"):
        pipeline.make_eval_batches(cfg, **HOST)
    with pytest.raises(ValueError, match=r"mixture_weights\[1\]=-1.0 must be a finite number > 0"):
        DataConfig(prepared=(str(out), str(out)), mixture_weights=(1.0, -1.0))


def test_vocab_larger_than_the_models_stops_before_compiling(tmp_path, docs, bpe):
    from training_helpers import tiny_train_config

    from orthros_jax.training import train

    path, _ = docs
    run_prepare([path], tmp_path / "out", bpe)
    data = DataConfig(prepared=(str(tmp_path / "out"),), tokenizer=bpe, seq_len=32, batch_size=4)
    cfg = dataclasses.replace(tiny_train_config(), data=data)
    with pytest.raises(ValueError, match=r"tokenizer has 300 ids but model.vocab_size=256"):
        train(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_chunk_table_streamed_to_disk_equals_the_in_memory_one(tmp_path, docs, monkeypatch):
    path, _ = docs
    run_prepare([path], tmp_path / "out")
    cached = prepared.open_split(str(tmp_path / "out"), None, 16, 0.3, "validation")[0].index
    from_file = cached.to_numpy()

    def read_only(*_, **__):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(prepared.os, "makedirs", read_only)
    (tmp_path / "out" / prepared.INDEX_DIR).rename(tmp_path / "moved")
    in_memory = prepared.open_split(str(tmp_path / "out"), None, 16, 0.3, "validation")[0].index
    assert cached.file is not None and in_memory.file is None
    table = in_memory.to_numpy()
    np.testing.assert_array_equal(from_file, table)
    assert len(table) > 10 and (table[:, 1] <= 16).all() and cached[3] == tuple(table[3])
