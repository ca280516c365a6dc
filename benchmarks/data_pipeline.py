"""Prepared (tokenised once, memory-mapped) vs in-memory training data: start-up, memory, throughput.

    python benchmarks/data_pipeline.py --out=results/data              # everything (~15 min)

Writes a synthetic corpus (Zipf-distributed pseudo-words, documents of ~2 KB, .jsonl) in a
work directory under runs/ and measures, each figure in a fresh process:
  ttfb      time to the first training batch and the process's peak RSS of
            make_train_iterator on prepared datasets of 20 MB, 200 MB and 2 GB of text
            (bytes: one token per byte, the most chunks per MB), cold (the chunk table built)
            and warm (cached), against today's in-memory pipeline on the sizes it holds;
            target: 2 GB within 1.3x of 20 MB;
  prepare   launch/prepare_data.py's throughput (MB/s of text, tokens/s) with a 32K BPE
            trained here on the embedded corpus, with 1 and 2 processes;
  step      a training step (--model_config's model) fed by the prepared iterator vs by
            in-memory batches, interleaved; target <= 5 % slower. Results: <out>/data_pipeline.*
"""  # noqa: E501 (the first line is --help's description: __doc__.split("\n")[0])

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
from data_pipeline_report import BATCH, SEQ_LEN, write_report  # benchmarks/: this directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_corpus(path: str, megabytes: float, block: list[str] | None = None) -> list[str]:
    """A .jsonl of ~megabytes of text: a 20 MB block of documents, repeated (ids differ by line)."""
    if block is None:
        rng = np.random.default_rng(0)
        letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
        words = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(5000)]
        words = np.array(words)
        block, size = [], 0
        while size < 20e6:
            n = int(rng.lognormal(5.5, 0.8)) + 5  # words per document (~2 KB on average)
            text = " ".join(words[np.minimum(rng.zipf(1.2, n), 5000) - 1])
            block.append(json.dumps({"text": text}) + "\n")
            size += len(text)
    chunk = "".join(block)
    with open(path, "w") as f:
        for _ in range(max(1, round(megabytes / 20))):
            f.write(chunk)
    return block


def train_bpe(path: str) -> None:
    """A 32,000-id byte-level BPE with <|endoftext|>, trained on the embedded corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from orthros_jax.data.corpus import embedded_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((d.text for d in embedded_documents(False)), trainer)
    tok.save(path)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def child_ttfb(args) -> None:
    """(In a fresh process) time to the first batch and the RSS it adds, printed as JSON. The
    peak is reset after the imports (/proc/self/clear_refs 5), so it is the iterator's; RSS
    after 21 batches split into anonymous memory and mapped file pages (page cache, which the
    kernel reclaims)."""
    from orthros_jax.data import DataConfig, make_train_iterator

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss0, anon0, file0 = _status_mb("VmRSS"), _status_mb("RssAnon"), _status_mb("RssFile")
    source = {"prepared": (args.data,)} if args.pipeline == "prepared" else {"corpus": (args.data,)}
    cfg = DataConfig(**source, tokenizer=args.tokenizer or None, seq_len=SEQ_LEN, batch_size=BATCH)
    t0 = time.perf_counter()
    it = make_train_iterator(cfg, process_index=0, process_count=1)
    next(it)
    first = time.perf_counter() - t0
    for _ in range(20):
        next(it)
    peak = _status_mb("VmHWM")
    again = []  # the same start 4 more times in this process: less noise from a busy machine
    for _ in range(4 if args.pipeline == "prepared" else 0):
        t0 = time.perf_counter()
        next(make_train_iterator(cfg, process_index=0, process_count=1))
        again.append(time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "ttfb_s": first,
                "ttfb_again_median_s": statistics.median(again) if again else None,
                "peak_rss_mb": peak,
                "import_rss_mb": rss0,
                "added_rss_mb": peak - rss0,
                "added_anon_mb": _status_mb("RssAnon") - anon0,
                "added_file_mb": _status_mb("RssFile") - file0,
            }
        )
    )


def _child(*argv: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *argv]
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare(inputs: str, out: str, tokenizer: str, processes: int, shard_mb: float) -> dict:
    """launch/prepare_data.py in a subprocess; its summary line's figures."""
    cmd = [
        sys.executable,
        "launch/prepare_data.py",
        f"--input={inputs}",
        f"--output={out}",
        f"--tokenizer={tokenizer}",
        f"--processes={processes}",
        f"--shard_mb={shard_mb}",
        "--progress=false",
    ]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime  # includes the imports
    line = done.stdout.strip().splitlines()[-1]
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    seconds = max(float(line.rsplit(" in ", 1)[1].split("s ->")[0]), 0.05)  # resumed: ~0
    return {
        "seconds": seconds,
        "text_mb": manifest["text_bytes"] / 1e6,
        "tokens": manifest["tokens"],
        "mb_per_s": manifest["text_bytes"] / 1e6 / seconds,
        "tokens_per_s": manifest["tokens"] / seconds,
        "shards": len(manifest["shards"]),
        "summary": line,
        "cpu_s_with_imports": cpu,
    }


def part_ttfb(work: str, sizes: list[int], memory_sizes: list[int], bpe: str | None) -> list:
    rows = []
    block = None
    for mb in sizes:
        corpus = os.path.join(work, f"corpus_{mb}mb.jsonl")
        block = write_corpus(corpus, mb, block)
        out = os.path.join(work, f"prepared_{mb}mb")
        prep = prepare(corpus, out, "", 2, 64)
        for state in ("cold", "warm"):
            if state == "cold":
                shutil.rmtree(os.path.join(out, "index"), ignore_errors=True)
            r = _child("--child", "--pipeline=prepared", f"--data={out}")
            rows.append(
                {"pipeline": "prepared", "tokenizer": "bytes", "text_mb": mb, "start": state, **r}
            )
            print(rows[-1], flush=True)
        if mb in memory_sizes:
            r = _child("--child", "--pipeline=memory", f"--data={corpus}")
            rows.append({"pipeline": "in-memory", "tokenizer": "bytes", "text_mb": mb, **r})
            print(rows[-1], flush=True)
        if bpe and mb == 20:
            out_bpe = os.path.join(work, f"prepared_{mb}mb_bpe")
            prepare(corpus, out_bpe, bpe, 2, 64)
            for pipeline, data in (("prepared", out_bpe), ("in-memory", corpus)):
                r = _child(
                    "--child", f"--pipeline={pipeline}", f"--data={data}", f"--tokenizer={bpe}"
                )
                rows.append({"pipeline": pipeline, "tokenizer": "bpe32k", "text_mb": mb, **r})
                print(rows[-1], flush=True)
        rows[-1]["prepare_s"] = prep["seconds"]
        if mb >= 1000:  # the big corpus goes once measured
            shutil.rmtree(out)
            os.remove(corpus)
    return rows


def part_prepare(work: str, bpe: str) -> list:
    corpus = os.path.join(work, "corpus_20mb.jsonl")
    if not os.path.isfile(corpus):
        write_corpus(corpus, 20)
    rows = []
    for processes in (1, 2):
        out = os.path.join(work, f"bpe_p{processes}")
        shutil.rmtree(out, ignore_errors=True)
        rows.append({"processes": processes, **prepare(corpus, out, bpe, processes, 2)})
        print(rows[-1], flush=True)
    same = all(
        open(os.path.join(work, "bpe_p1", n), "rb").read()
        == open(os.path.join(work, "bpe_p2", n), "rb").read()
        for n in os.listdir(os.path.join(work, "bpe_p1"))
        if n.endswith((".bin", ".npy", ".json"))
    )
    rows.append({"identical_outputs_1_vs_2_processes": same})
    return rows


def part_step(work: str, rounds: int, steps: int, model_config: str) -> dict:
    """Train steps (model_config's model on tiny_pt.py's run): prepared vs in-memory batches."""
    import jax

    from orthros_jax.config import cli
    from orthros_jax.data import DataConfig, make_train_iterator
    from orthros_jax.parallel import mesh as pmesh
    from orthros_jax.parallel import sharding
    from orthros_jax.training import TrainConfig
    from orthros_jax.training.optimizer import make_optimizer
    from orthros_jax.training.start import abstract_state, fresh_state
    from orthros_jax.training.steps import make_train_step

    data = os.path.join(work, "prepared_20mb")
    if not os.path.isfile(os.path.join(data, "manifest.json")):
        corpus = os.path.join(work, "corpus_20mb.jsonl")
        if not os.path.isfile(corpus):
            write_corpus(corpus, 20)
        prepare(corpus, data, "", 2, 64)
    cfg = TrainConfig.from_config(cli.load_config_file(os.path.join(REPO, "configs/tiny_pt.py")))
    model = cli.load_config_file(os.path.join(REPO, model_config)).model
    data_cfg = DataConfig(prepared=(data,), seq_len=SEQ_LEN, batch_size=BATCH)
    model_cfg = type(cfg.model).from_dict(cli.to_plain(model))
    cfg = dataclasses.replace(cfg, model=model_cfg, data=data_cfg)
    mesh = pmesh.make_mesh(cfg.mesh)
    tx = make_optimizer(cfg.optimizer, cfg.train.steps, cfg.model)
    abstract, params_sh = abstract_state(cfg, tx, mesh)
    state = fresh_state(cfg, tx, abstract, params_sh)
    it = make_train_iterator(cfg.data, process_index=0, process_count=1)
    memory = [next(it) for _ in range(steps)]
    first = pmesh.shard_batch(memory[0], mesh)
    state_sh = jax.tree.map(lambda a: a.sharding, abstract)
    step = sharding.jit_train_step(
        make_train_step(cfg.model, cfg.optimizer, tx, cfg.train.steps),
        state_sh,
        mesh,
        {k: v.ndim for k, v in first.items()},
    )
    state, m = step(state, first)
    jax.block_until_ready(m)
    times: dict[str, list[float]] = {"prepared": [], "in-memory": []}
    for r in range(rounds):
        for name in ("prepared", "in-memory") if r % 2 == 0 else ("in-memory", "prepared"):
            t0 = time.perf_counter()
            for i in range(steps):
                batch = next(it) if name == "prepared" else memory[i]
                state, m = step(state, pmesh.shard_batch(batch, mesh))
            jax.block_until_ready(m)
            times[name].append((time.perf_counter() - t0) / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "step_s": med,
        "ratio_prepared_over_memory": med["prepared"] / med["in-memory"],
        "rounds": rounds,
        "steps_per_round": steps,
        "per_round": times,
    }


def part_format(work: str, reads: int = 20000) -> dict:
    """On-disk format: the 20 MB prepared (bytes) dataset's documents also written as ArrayRecord
    (one record per document, group_size:1 for random access, as grain reads it), then
    `reads` random training chunks read through each (grain's ArrayRecordDataSource + slicing
    vs PreparedChunks: os.pread of the flat shard)."""
    import grain
    from array_record.python.array_record_module import ArrayRecordWriter

    from orthros_jax.data import prepared

    data = os.path.join(work, "prepared_20mb")
    source, manifest = prepared.open_split(data, None, SEQ_LEN, 0.05, "train")
    path = os.path.join(work, "docs.array_record")
    t0 = time.perf_counter()
    writer = ArrayRecordWriter(path, "group_size:1")
    doc_of = {}  # global token start of each document -> record number
    for shard, offset in zip(
        manifest["shards"], np.cumsum([0] + [s["tokens"] for s in manifest["shards"]]), strict=False
    ):
        ids = np.fromfile(os.path.join(data, shard["name"] + ".bin"), manifest["dtype"])
        ends = np.load(os.path.join(data, shard["name"] + ".docs.npy"))["end"]
        for a, b in zip([0, *ends[:-1]], ends, strict=True):
            doc_of[int(offset + a)] = len(doc_of)
            writer.write(ids[a:b].tobytes())
    writer.close()
    write_s = time.perf_counter() - t0
    starts = np.array(sorted(doc_of))
    records = grain.sources.ArrayRecordDataSource([path])
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(source), reads)

    def via_array_record(i: int) -> np.ndarray:
        start, n = (int(v) for v in source.index[i])
        d = int(np.searchsorted(starts, start, side="right")) - 1
        ids = np.frombuffer(records[doc_of[int(starts[d])]], manifest["dtype"])
        local = start - int(starts[d])
        return ids[local : local + n + 1].astype(np.int32)

    timings = {}
    for name, read in (
        ("flat", lambda i: np.concatenate([(e := source[i])["tokens"], e["targets"][-1:]])),
        ("array_record", via_array_record),
    ):
        t0 = time.perf_counter()
        for i in picks:
            read(int(i))
        timings[name] = (time.perf_counter() - t0) / reads * 1e6
    for i in picks[:200]:  # same tokens either way
        e = source[int(i)]
        assert np.array_equal(
            np.concatenate([e["tokens"], e["targets"][-1:]]), via_array_record(int(i))
        )
    flat = sum(
        os.path.getsize(os.path.join(data, f))
        for f in os.listdir(data)
        if f.endswith((".bin", ".npy"))
    )
    return {
        "read_us_per_chunk": timings,
        "array_record_write_s": write_s,
        "bytes": {"flat_shards": flat, "array_record": os.path.getsize(path)},
        "reads": reads,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/data")
    p.add_argument("--work", default=os.path.join(REPO, "runs", "data_bench"))
    p.add_argument("--sizes_mb", default="20,200,2000")
    p.add_argument("--memory_sizes_mb", default="20,200")
    p.add_argument("--bpe_rows", type=int, default=1, help="0: no BPE rows in ttfb")
    p.add_argument("--parts", default="prepare,ttfb,format,step")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model_config", default="configs/tiny_pt.py", help="its model section")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--pipeline", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default="", help=argparse.SUPPRESS)
    p.add_argument("--report_only", action="store_true", help="rewrite the .md from the .json")
    args = p.parse_args()
    if args.report_only:
        return write_report(args.out, {})
    if args.child:
        return child_ttfb(args)
    os.makedirs(args.work, exist_ok=True)
    parts = args.parts.split(",")
    results: dict = {"cpus": os.cpu_count()}
    bpe = os.path.join(args.work, "bpe32k.json")
    if ("prepare" in parts or "ttfb" in parts) and not os.path.isfile(bpe):
        t0 = time.perf_counter()
        train_bpe(bpe)
        results["bpe_train_s"] = time.perf_counter() - t0
    if "prepare" in parts:
        results["load_prepare"] = [round(x, 1) for x in os.getloadavg()]
        results["prepare"] = part_prepare(args.work, bpe)
    if "ttfb" in parts:
        results["load_ttfb"] = [round(x, 1) for x in os.getloadavg()]
        sizes = [int(s) for s in args.sizes_mb.split(",")]
        mem = [int(s) for s in args.memory_sizes_mb.split(",") if s]
        rows = part_ttfb(args.work, sizes, mem, bpe if args.bpe_rows else None)
        old = os.path.join(args.out, "data_pipeline.json")
        if os.path.isfile(old):  # rows of sizes not rerun are kept
            key = lambda r: (r["pipeline"], r["tokenizer"], r["text_mb"], r.get("start"))  # noqa: E731
            done = {key(r) for r in rows}
            rows += [r for r in json.load(open(old)).get("ttfb", []) if key(r) not in done]
        results["ttfb"] = sorted(rows, key=lambda r: r["text_mb"])
    if "format" in parts:
        results["load_format"] = [round(x, 1) for x in os.getloadavg()]
        results["format"] = part_format(args.work)
        print(results["format"], flush=True)
    if "step" in parts:
        results["load_step"] = [round(x, 1) for x in os.getloadavg()]
        results["step"] = part_step(args.work, args.rounds, args.steps, args.model_config)
    write_report(args.out, results)
    print(open(os.path.join(args.out, "data_pipeline.md")).read())


if __name__ == "__main__":
    main()
