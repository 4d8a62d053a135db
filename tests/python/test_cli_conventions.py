"""What every qmoe command does alike, as a new user meets it: --version with the commit, help with
examples and the exit codes, the same option names across commands, output paths checked before
any work starts (exit 3, nothing written), and `qmoe bench` rows that describe themselves (commit,
settings, time) on stdout, in --csv and in --json, with no file written unless asked."""

import csv
import json
import os
import re

import pytest

from ortqmoe import run_cli

USAGE_EXIT, IO_EXIT = 2, 3
# A tiny layer of the smallest preset's routing and activation: seconds on two cores.
TINY = ["--backend", "cpu", "--presets", "qwen3-30b-a3b", "--shape", "256,128,8,2", "--tokens",
        "1,2", "--repeat", "1", "--warmup", "0"]


def test_version_names_the_commit(cli):
    r = run_cli(cli, ["--version"])
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"qmoe \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,}(-dirty)?|unknown)\)",
                        r.stdout.strip()), r.stdout


@pytest.mark.parametrize("command", [[], ["run"], ["bench"], ["make-layer"]])
def test_help_has_examples_and_exit_codes(cli, command):
    r = run_cli(cli, command + ["--help"])
    assert r.returncode == 0, r.stderr
    assert "Examples:" in r.stdout, r.stdout
    assert "Exit codes:" in r.stdout and "3 an I/O error" in r.stdout, r.stdout


def test_preset_and_presets_are_both_accepted(cli, tmp_path):
    for flag in ["--preset", "--presets"]:
        args = ["bench", "--backend", "cpu", flag, "no-such-model", "--tokens", "1"]
        r = run_cli(cli, args)
        assert r.returncode == USAGE_EXIT and "no-such-model" in r.stderr, (flag, r.stderr)
        r = run_cli(cli, ["run", flag, "no-such-model"])
        assert r.returncode == USAGE_EXIT and "no-such-model" in r.stderr, (flag, r.stderr)


@pytest.mark.parametrize("args", [
    ["bench", "--backend", "cpu", "--csv", "{missing}/rows.csv"],
    ["bench", "--backend", "cpu", "--json", "{missing}/rows.json"],
    ["bench", "--backend", "cpu", "--tune", "{missing}/tune.json"],
    ["bench", "--backend", "cpu", "--csv", "{dir}"],
    ["make-layer", "--layer-out", "{missing}/l.safetensors"],
    ["make-layer", "--layer-out", "{dir}/l.safetensors", "--input-out", "{missing}/x.safetensors"],
])
def test_output_paths_checked_before_any_work(cli, tmp_path, args):
    missing = tmp_path / "no" / "such" / "folder"
    args = [a.format(missing=missing, dir=tmp_path) for a in args]
    r = run_cli(cli, args, timeout=30)
    assert r.returncode in (USAGE_EXIT, IO_EXIT), f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "error" in r.stderr and any(a in r.stderr for a in ("--csv", "--json", "--tune",
                                                               "--layer-out", "--input-out"))
    # Nothing was synthesized or timed first, and nothing was written.
    assert "synthesized" not in r.stdout and "wrote" not in r.stdout, r.stdout
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_run_output_checked_before_the_layer_runs(cli, tmp_path):
    r = run_cli(cli, ["run", "--layer", tmp_path / "l.safetensors", "--input",
                      tmp_path / "x.safetensors", "--output", tmp_path / "no" / "y.safetensors"])
    assert r.returncode == IO_EXIT, f"exit {r.returncode}\n{r.stderr}"
    assert "--output" in r.stderr, r.stderr


def _env_without_knobs(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QMOE_")}
    env.update(extra)
    return env


def test_bench_writes_no_file_unless_asked(cli, tmp_path):
    r = run_cli(cli, ["bench"] + TINY, timeout=180, cwd=tmp_path, env=_env_without_knobs())
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert list(tmp_path.iterdir()) == [], f"bench wrote {list(tmp_path.iterdir())}"
    # The rows are on stdout, under a header naming the build, the settings and the time.
    assert re.search(r"^build\s+qmoe \S+ \(commit ", r.stdout, re.M), r.stdout
    assert re.search(r"^settings\s+defaults$", r.stdout, re.M), r.stdout
    assert re.search(r"^started\s+\d{4}-\d\d-\d\dT", r.stdout, re.M), r.stdout


def test_bench_rows_describe_themselves(cli, tmp_path):
    env = _env_without_knobs(QMOE_TEST_KNOB="7")
    out_csv, out_json = tmp_path / "rows.csv", tmp_path / "rows.json"
    r = run_cli(cli, ["bench"] + TINY + ["--csv", out_csv, "--json", out_json], timeout=180,
                cwd=tmp_path, env=env)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert "QMOE_TEST_KNOB=7" in r.stdout, r.stdout
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    doc = json.loads(out_json.read_text())
    assert [row["tokens"] for row in rows] == ["1", "2"], rows
    assert [row["tokens"] for row in doc["rows"]] == ["1", "2"], doc
    version = run_cli(cli, ["--version"]).stdout
    for row in rows + doc["rows"]:
        assert row["commit"] and row["commit"] in version, (row, version)
        assert "QMOE_TEST_KNOB=7" in row["settings"], row
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", row["time_utc"]), row
    assert doc["commit"] == rows[0]["commit"] and doc["settings"]["QMOE_TEST_KNOB"] == "7", doc
    assert doc["rows"][0]["us_median"] == rows[0]["us_median"], (doc["rows"][0], rows[0])
