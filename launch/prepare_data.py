"""Tokenise a corpus once into sharded token files that training reads lazily.

    python launch/prepare_data.py --input='data/fineweb-edu/*.parquet' --output=data/fw \
        --tokenizer=data/tokenizer.json
    python launch/train.py --config=configs/pt_1p3b.py --config.data.prepared=data/fw \
        --config.data.tokenizer=data/tokenizer.json --workdir=runs/pt

--input: comma-separated files, directories (walked for .txt/.md/.rst/.py/.jsonl/.parquet) or
globs; a `.jsonl` gives one document per line (--text_field), a `.parquet` one per row of
column --text_field, any other file one document. --tokenizer: a tokenizer.json, or empty for
UTF-8 bytes. Shards of about --shard_mb of text are tokenised by --processes worker processes
(default: every core), each written under a temporary name and renamed when complete, so
rerunning the same command after a kill redoes only the unfinished shards. The output is a
pure function of the inputs and options (same bytes on every run). An input line that cannot
be read stops the run with its file and line (--on_bad=stop), or is skipped and counted
(--on_bad=skip). Several machines: run the same command with --task=k --tasks=n on machine k
(any scheduler; a task does the shards i with i % n == k and writes no manifest), then once
without --task on the shared output directory to check every shard and write manifest.json.
Layout and format choice: docs/data.md.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import time

from absl import app, flags

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # parallelism is the worker processes

from orthros_jax.data import prepare  # noqa: E402
from orthros_jax.data.corpus import expand_corpus  # noqa: E402

_INPUT = flags.DEFINE_list("input", None, "Files, directories or globs (comma-separated).")
_OUTPUT = flags.DEFINE_string("output", None, "Output directory (created; resumed if it exists).")
_TOKENIZER = flags.DEFINE_string("tokenizer", "", "tokenizer.json path; empty = UTF-8 bytes.")
_FIELD = flags.DEFINE_string("text_field", "text", "The .jsonl field / .parquet column of text.")
_ON_BAD = flags.DEFINE_enum("on_bad", "stop", ["stop", "skip"], "An unreadable input line.")
_SHARD_MB = flags.DEFINE_float("shard_mb", 64.0, "Text per shard (MB).")
_PROCESSES = flags.DEFINE_integer("processes", os.cpu_count() or 1, "Worker processes.")
_TASK = flags.DEFINE_integer("task", None, "Only shards i with i % tasks == task; no manifest.")
_TASKS = flags.DEFINE_integer("tasks", 1, "Number of --task machines.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.mark_flags_as_required(["input", "output"])

_progress_queue = None


def _init_worker(q) -> None:
    global _progress_queue
    _progress_queue = q


def _run_shard(args: tuple[str, int, dict]) -> dict:
    out_dir, index, plan = args
    report = None if _progress_queue is None else lambda *c: _progress_queue.put(c)
    return prepare.prepare_shard(out_dir, index, plan, report)


def _bar(total_bytes: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        desc="prepare",
        disable=not enabled,
        file=sys.stderr,
        smoothing=0.1,
    )


def prepare_all(plan: dict, out_dir: str, shards: list[int], processes: int, progress: bool):
    """Runs prepare_shard over `shards` (resumed ones return at once); records by index."""
    todo_bytes = sum(
        p["end"] - p["start"]
        for i in shards
        if prepare.shard_done(out_dir, i) is None
        for p in plan["shards"][i]
    )
    totals = [0, 0]
    bar = _bar(todo_bytes, progress)

    def advance(docs: int, tokens: int, text_bytes: int) -> None:
        totals[0] += docs
        totals[1] += tokens
        bar.update(text_bytes)
        bar.set_postfix(docs=f"{totals[0]:,}", tokens=f"{totals[1]:,}", refresh=False)

    jobs = [(out_dir, i, plan) for i in shards]
    if processes <= 1 or len(jobs) <= 1:
        records = [prepare.prepare_shard(out_dir, i, plan, advance) for i in shards]
    else:
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        with ctx.Pool(min(processes, len(jobs)), _init_worker, (q,)) as pool:
            result = pool.map_async(_run_shard, jobs, chunksize=1)
            while not result.ready() or not q.empty():
                try:
                    advance(*q.get(timeout=0.1))
                except queue.Empty:
                    pass
            records = result.get()  # re-raises a worker's ValueError
    bar.close()
    return dict(zip(shards, records, strict=True))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    t0 = time.perf_counter()
    try:
        if _TASK.value is not None and not 0 <= _TASK.value < _TASKS.value:
            raise ValueError(f"--task={_TASK.value} must be in [0, --tasks={_TASKS.value})")
        files = expand_corpus(_INPUT.value)
        plan = prepare.make_plan(
            files,
            _TOKENIZER.value or None,
            text_field=_FIELD.value,
            skip_bad=_ON_BAD.value == "skip",
            shard_bytes=max(1, int(_SHARD_MB.value * 1e6)),
        )
        out = _OUTPUT.value
        prepare.check_plan(out, plan)
        if _TASK.value is None:  # other tasks may be writing on a shared directory
            prepare.remove_temporaries(out)
        n = len(plan["shards"])
        mine = [i for i in range(n) if _TASK.value is None or i % _TASKS.value == _TASK.value]
        resumed = sum(prepare.shard_done(out, i) is not None for i in mine)
        records = prepare_all(plan, out, mine, _PROCESSES.value, _PROGRESS.value)
    except ValueError as e:
        raise SystemExit(f"prepare_data.py: {e}") from None
    took = time.perf_counter() - t0
    done = list(records.values())
    text = sum(r["text_bytes"] for r in done)
    skipped = sum(r["skipped"] for r in done)
    where = (
        f"{out} (shards {len(mine)} of {n}, task {_TASK.value})" if _TASK.value is not None else out
    )
    if _TASK.value is None:
        prepare.write_manifest(out, plan, [records[i] for i in range(n)])
        where = os.path.join(out, prepare.MANIFEST)
    first_bad = next((r["skipped_lines"][0] for r in done if r["skipped_lines"]), None)
    print(
        f"prepared {sum(r['documents'] for r in done):,} documents, "
        f"{sum(r['tokens'] for r in done):,} tokens ({done[0]['dtype']}) in {len(done)} shards "
        f"({resumed} resumed), {text / 1e6:,.1f} MB of text, "
        f"{sum(os.path.getsize(os.path.join(out, r['name'] + '.bin')) for r in done) / 1e6:,.1f} "
        f"MB of tokens in {took:.1f}s -> {where}"
        + (f"; skipped {skipped} bad lines (first: {first_bad})" if skipped else "")
    )


if __name__ == "__main__":
    app.run(main)
