"""The report of benchmarks/data_pipeline.py: data_pipeline.json (parts of earlier runs kept
unless rerun) and data_pipeline.md, the tables docs/data.md quotes."""

from __future__ import annotations

import json
import os

SEQ_LEN, BATCH = 256, 16  # data_pipeline.py's iterator shape


def write_report(out: str, results: dict) -> None:
    """<out>/data_pipeline.json (parts of earlier runs kept unless rerun) and .md."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "data_pipeline.json")
    if os.path.isfile(path):
        with open(path) as f:
            results = json.load(f) | results
    with open(os.path.join(out, "data_pipeline.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [
        "# Data pipeline benchmark\n",
        "`python benchmarks/data_pipeline.py --out=results/data`; "
        "2-core shared CPU; 1/5/15-min load averages per part below.\n",
    ]
    if "ttfb" in results:
        lines += [
            f"time to first batch and memory of make_train_iterator (T={SEQ_LEN}, B={BATCH}), "
            f"load {results['load_ttfb']}; RSS added over the imports, after 21 batches\n",
            "| pipeline | tokenizer | text MB | start | first batch s | again (median of 4) s | "
            "peak RSS MB | added peak MB | added anonymous MB | added file-mapped MB |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["ttfb"]:
            again = r.get("ttfb_again_median_s")
            lines.append(
                f"| {r['pipeline']} | {r['tokenizer']} | {r['text_mb']} | {r.get('start', '')} | "
                f"{r['ttfb_s']:.2f} | {'' if again is None else f'{again:.3f}'} | "
                f"{r['peak_rss_mb']:.0f} | {r['added_rss_mb']:.1f} | "
                f"{r.get('added_anon_mb', float('nan')):.1f} | "
                f"{r.get('added_file_mb', float('nan')):.1f} |"
            )
    if "prepare" in results:
        lines += [
            "",
            f"prepare with the 32K BPE, load {results['load_prepare']}\n",
            "| processes | text MB | wall s | MB/s | tokens/s | CPU s (with imports) | shards |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results["prepare"]:
            if "processes" in r:
                lines.append(
                    f"| {r['processes']} | {r['text_mb']:.1f} | {r['seconds']:.1f} | "
                    f"{r['mb_per_s']:.2f} | {r['tokens_per_s']:,.0f} | "
                    f"{r['cpu_s_with_imports']:.1f} | {r['shards']} |"
                )
            else:
                lines.append(f"\n{r}")
    if "format" in results:
        f = results["format"]
        lines += [
            "",
            f"format (load {results['load_format']}): random chunk read: "
            f"flat shards {f['read_us_per_chunk']['flat']:.1f} us, "
            f"ArrayRecord {f['read_us_per_chunk']['array_record']:.1f} us; bytes on disk "
            f"{f['bytes']['flat_shards']:,} vs {f['bytes']['array_record']:,}",
        ]
    if "step" in results:
        s = results["step"]
        lines += [
            "",
            f"tiny config train step (load {results['load_step']}, {s['rounds']} interleaved "
            f"rounds of {s['steps_per_round']} steps, medians): "
            f"prepared {s['step_s']['prepared'] * 1e3:.1f} ms, in-memory "
            f"{s['step_s']['in-memory'] * 1e3:.1f} ms, ratio {s['ratio_prepared_over_memory']:.3f}",
        ]
    with open(os.path.join(out, "data_pipeline.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
