"""The rough edges a new user hit (issue 22), each where it can fail: resuming with a changed
model field, metrics replayed after a kill, warnings, one-line launcher errors, --help, "did you
mean", context-length warnings, the harness's device note, and training's summaries."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys

import pytest
from training_helpers import REPO, run_launchers

from orthros_jax import checkpoint
from orthros_jax.config import ModelConfig, cli
from orthros_jax.training import TrainConfig, train
from orthros_jax.training.metrics import drop_replayed
from orthros_jax.training.start import check_resumed_model, config_warnings


def _cfg(**model) -> TrainConfig:
    c = cli.load_config_file(os.path.join(REPO, "configs/tiny_pt.py"))
    for k, v in model.items():
        c.model[k] = v
    return TrainConfig.from_config(c)


def test_a_changed_model_field_on_resume_is_refused(tmp_path):
    trained = _cfg()
    checkpoint.write_model_json(str(tmp_path), trained.model, None, 256)
    os.makedirs(tmp_path / "checkpoints" / "10")
    before = (tmp_path / "model.json").read_text()
    with pytest.raises(ValueError, match=r"model\.window=16 \(trained with 64\)"):
        train(_cfg(window=16), str(tmp_path))
    assert (tmp_path / "model.json").read_text() == before  # never rewritten to disagree
    check_resumed_model(_cfg(remat="full", prefill_chunk=512), str(tmp_path))  # runtime knobs
    os.rmdir(tmp_path / "checkpoints" / "10")
    check_resumed_model(_cfg(window=16), str(tmp_path))  # no weights yet: nothing to disagree


def test_metrics_of_replayed_steps_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "split": "train", "loss": 1.0} for s in (5, 10, 15, 20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2')  # cut off
    assert drop_replayed(str(path), 10) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [5, 10]
    assert drop_replayed(str(tmp_path / "absent.jsonl"), 10) == 0


def test_warmup_covering_the_run_is_warned():
    c = cli.load_config_file(os.path.join(REPO, "configs/tiny_pt.py"))
    c.optimizer.warmup_steps, c.train.steps = 50, 40
    (warning,) = config_warnings(TrainConfig.from_config(c))
    assert "warmup_steps=50 >= train.steps=40" in warning
    c.train.steps = 51
    assert config_warnings(TrainConfig.from_config(c)) == []


def test_did_you_mean_names_the_closest_key():
    with pytest.raises(ValueError, match=r"'widow' \(did you mean 'window'\?\)"):
        ModelConfig.from_dict({"widow": 3})
    with pytest.raises(ValueError, match=r"did you mean 'model.widow' -> 'model.window'"):
        cli.check_override_keys(
            ["--config.model.widow=3"], default=os.path.join(REPO, "configs/tiny_pt.py")
        )
    assert cli.did_you_mean(["zzzz"], ["window"]) == ""


def test_prompts_beyond_the_known_context_are_flagged():
    loaded = checkpoint.LoadedModel(ModelConfig(), None, None, 256)
    assert "9000 tokens are beyond the 256" in loaded.beyond_context(9000)
    assert loaded.beyond_context(256) is None
    assert checkpoint.LoadedModel(ModelConfig(), None, None).beyond_context(10**6) is None


# Each launcher's own flags, as --help lists them; experiments.py's default arms are the attention
# arms (docs/results.md's command, with no --arms, reproduces results/: the GDN arms are opt-in).
HELP = {
    "launch/train.py": ["--config", "--workdir"],
    "launch/evaluate.py": ["--config"],
    "launch/benchmark.py": ["--config", "--out", "--suites"],
    "launch/mqar.py": ["--arms", "--out", "--seeds", "--tiny"],
    "launch/convert.py": ["--export", "--hf_dir", "--remote"],
    "launch/generate.py": ["--model", "--prompt"],
    "launch/experiments.py": ["--arms"],
}
DEFAULT_ARMS = "(default: 'transformer,swa,orthros,orthros_noso')"


def _errors(tmp_path) -> list[tuple[list[str], str]]:
    """Command lines -> the message each one's one-line error ends with."""
    return [
        (["launch/train.py", "--config=configs/nope.py", "--workdir=x"], "no such file"),
        (["launch/benchmark.py", "--suites=prefil", "--out=x"], "unknown suite(s) ['prefil']"),
        (["launch/benchmark.py"], "--out is required"),
        (["launch/convert.py", "--out=x"], "import takes --hf_dir"),
        (["launch/train.py", "--workdri=x"], "Did you mean: workdir"),
        (
            ["launch/generate.py", "--model=x", "--prompt=a", "--speculative_k=-1"],
            "--speculative_k must be >= 0, got -1",
        ),
    ]


def test_launchers_help_and_one_line_errors(tmp_path):
    """Every launcher's --help exits 0 listing its own flags; each bad command line fails with
    a one-line message (no traceback). One subprocess runs them all (run_launchers), each as
    its own `python SCRIPT ARGS`: a process each would import jax and the package each time."""
    errors = _errors(tmp_path)
    # Refusals checked by their message anywhere in stderr (an unknown key's lists the valid
    # keys): train.py's unknown config key (before the workdir is made), evaluate.py's model
    # dir without model.json and its unknown config key.
    model, out = f"--model={tmp_path}", f"--out={tmp_path}/out"
    listing = [
        (["launch/train.py", "--config.train.stepz=3", f"--workdir={tmp_path}/bad"], "train.stepz"),
        (["launch/evaluate.py", model, out], "model.json"),
        (
            ["launch/evaluate.py", model, out, "--config.sample=2"],
            "unknown config key(s) ['sample']",
        ),
    ]
    runs = run_launchers(
        [[script, "--help"] for script in HELP] + [a for a, _ in errors] + [a for a, _ in listing],
        tmp_path,
    )
    for done, (args, message) in zip(runs[-len(listing) :], listing, strict=True):
        assert done.returncode != 0 and message in done.stderr, (args, done.stderr[-2000:])
    assert "train.steps" in runs[-3].stderr  # the valid key beside the unknown one
    assert "lm_seq_len" in runs[-1].stderr
    runs = runs[: -len(listing)]
    for done, (script, own) in zip(runs[: len(HELP)], HELP.items(), strict=True):
        assert done.returncode == 0, (script, done.stderr[-2000:])
        for flag in own:
            name = flag.removeprefix("--")
            assert f"  --{name}" in done.stdout or f"  --[no]{name}" in done.stdout, (script, flag)
    assert DEFAULT_ARMS in runs[list(HELP).index("launch/experiments.py")].stdout
    for done, (args, message) in zip(runs[len(HELP) :], errors, strict=True):
        assert done.returncode != 0, args
        lines = [line for line in done.stderr.splitlines() if line.strip() and "libtpu" not in line]
        assert message in lines[-1] and "Traceback" not in done.stderr, (args, done.stderr[-2000:])
    assert not os.path.exists(tmp_path / "bad") and not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_harness_warns_only_for_a_device_the_user_chose(tmp_path, caplog):
    pytest.importorskip("lm_eval")
    import jax

    from orthros_jax.evaluation.harness import OrthrosHarnessLM
    from orthros_jax.model import init_params

    cfg = ModelConfig(
        vocab_size=256, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32
    )
    loaded = checkpoint.LoadedModel(cfg, init_params(cfg, jax.random.PRNGKey(0)), None)
    with caplog.at_level(logging.WARNING):
        OrthrosHarnessLM(loaded=loaded, device="cuda:0")  # lm-eval's default
    assert "is ignored" not in caplog.text
    with caplog.at_level(logging.WARNING):
        OrthrosHarnessLM(loaded=loaded, device="mps")
    assert "device='mps' is ignored" in caplog.text
    # The context the model knows is the default max_length; a longer one is warned about.
    trained = dataclasses.replace(loaded, max_context=64)
    assert OrthrosHarnessLM(loaded=trained).max_length == 64
    with caplog.at_level(logging.WARNING):
        OrthrosHarnessLM(loaded=trained, max_length=128)
    assert "128 tokens are beyond the 64" in caplog.text


# Runs the harness command's main (what `python -m orthros_jax.evaluation.harness` runs) once
# per model dir in one process: lm-eval's import is the cost, paid once. Each exit's message
# goes to stdout as a JSON line; stderr is what the user would see besides.
_HARNESS_RUNS = """
import json, sys
from orthros_jax.evaluation.harness import main
for model_dir in sys.argv[1:]:
    try:
        main(["--model", "orthros_jax", "--model_args", f"model={model_dir}",
              "--tasks", "arc_easy"])
    except SystemExit as e:
        print(json.dumps({"code": e.code}), flush=True)
    else:
        print(json.dumps({"code": None}), flush=True)
"""


@pytest.mark.slow
def test_harness_command_errors_are_one_line(tmp_path):
    """The harness command (`python -m orthros_jax.evaluation.harness`): a bad model dir and an
    unreachable task dataset (the Hub offline) each end with a one-line message, not a
    traceback."""
    pytest.importorskip("lm_eval")
    import jax

    from orthros_jax.model import init_params

    cfg = ModelConfig(
        vocab_size=256, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32
    )
    model = str(tmp_path / "m")
    checkpoint.save_model(model, cfg, init_params(cfg, jax.random.PRNGKey(0)))
    env = dict(
        os.environ,
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "empty_cache"),
    )
    done = subprocess.run(
        [sys.executable, "-c", _HARNESS_RUNS, str(tmp_path / "none"), model],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    exits = [json.loads(line)["code"] for line in done.stdout.splitlines() if '"code"' in line]
    assert len(exits) == 2, done.stdout[-2000:]
    messages = ("has no model.json", "dataset cannot be loaded here")
    for code, message in zip(exits, messages, strict=True):
        # A string code: Python prints it as the process's last stderr line and exits 1.
        assert isinstance(code, str) and "\n" not in code, code
        assert code.startswith("python -m orthros_jax.evaluation.harness: ") and message in code


def test_a_missing_extra_is_one_line_naming_it(monkeypatch):
    def main(argv):
        raise ModuleNotFoundError("No module named 'lm_eval'", name="lm_eval")

    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    with pytest.raises(
        SystemExit, match=r"evaluate.py: needs the 'lm_eval' package: pip install -e '\.\[eval\]'"
    ):
        cli.run(main, "evaluate.py")

    def bad(argv):
        raise ModuleNotFoundError("No module named 'not_an_extra'", name="not_an_extra")

    with pytest.raises(ModuleNotFoundError):  # not an optional dependency: a real bug
        cli.run(bad, "evaluate.py")
