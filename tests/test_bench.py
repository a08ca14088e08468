"""The benchmark (valuelab.lab.bench): it runs, it stores what it says, and every contender it times computes GAE.

A contender that times another computation makes a ratio meaningless, so
each one is compared with ``valuelab.gae`` on the tokens it is defined on:
the verl loop on right-padded rows and on rows with holes, SciPy's lfilter
and TorchRL on right-padded rows. The SciPy and TorchRL tests skip when
those packages are absent; the benchmark then runs without their columns.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import valuelab
from valuelab._engine import native as _native
from valuelab.lab import bench

DTYPES = [torch.float32, torch.float64]
# (gamma, lam): the benchmark's, a discounted one, and lam = 1 (Monte-Carlo minus the value)
CONSTANTS = [(1.0, 0.95), (0.99, 0.9), (0.97, 1.0)]
# on valid tokens, |contender - valuelab.gae| <= ATOL[dtype] * (1 + |valuelab.gae|)
ATOL = {torch.float32: 2e-4, torch.float64: 1e-10}
CPU = torch.device("cpu")


def _reference(r, v, m, gamma, lam):
    out = valuelab.gae(r, v, mask=m, gamma=gamma, lam=lam)
    return out.advantages, out.returns


def _assert_close_on(mask, got, want, atol):
    """``got`` equals ``want`` (advantages and returns) on the tokens where ``mask`` is True."""
    for g, w in zip(got, want):
        assert g.shape == w.shape
        diff = (g - w)[mask].abs()
        bound = atol * (1 + w[mask].abs())
        assert bool((diff <= bound).all()), f"max error {float(diff.max()):.3g}"


def _random_holes(B, T, seed):
    """A mask with holes anywhere: at the start, the end, runs, single tokens, a row with nothing valid."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[0] = False
    mask[1, :5] = False
    mask[2, -5:] = False
    mask[3] = True
    return mask


def _right_padded_edges(B, T, seed):
    """Right-padded rows with the edge lengths included: 0, 1, T-1 and T."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B, 1), generator=gen)
    lengths[:4, 0] = torch.tensor([0, 1, T - 1, T])
    return torch.arange(T) < lengths


# ---------------------------------------------------------------------------
# the contenders against valuelab.gae
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma,lam", CONSTANTS)
@pytest.mark.parametrize("holes", [False, True])
def test_verl_loop_equals_gae(dtype, gamma, lam, holes):
    r, v, m = bench.make_batch(6, 200, dtype, CPU, holes=holes, seed=1)
    assert holes == bool((m[:, :-1] < m[:, 1:]).any())  # a False followed by a True: a hole
    _assert_close_on(m, bench.verl_gae(r, v, m, gamma, lam), _reference(r, v, m, gamma, lam), ATOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_verl_loop_equals_gae_on_arbitrary_holes(dtype):
    r, v, _ = bench.make_batch(8, 64, dtype, CPU, holes=False, seed=2)
    m = _random_holes(8, 64, seed=3)
    _assert_close_on(m, bench.verl_gae(r, v, m, 0.99, 0.95), _reference(r, v, m, 0.99, 0.95), ATOL[dtype])


def test_verl_loop_carries_over_a_hole():
    # by hand: one hole between two valid tokens, gamma = 1, lam = 1/2
    r = torch.tensor([[1.0, 100.0, 2.0]])
    v = torch.tensor([[0.5, 100.0, 0.25]])
    m = torch.tensor([[True, False, True]])
    adv, ret = bench.verl_gae(r, v, m, 1.0, 0.5)
    a2 = 2.0 - 0.25
    a0 = (1.0 + 0.25 - 0.5) + 0.5 * a2
    assert torch.allclose(adv[0, [0, 2]], torch.tensor([a0, a2]))
    assert torch.allclose(ret[0, [0, 2]], torch.tensor([a0 + 0.5, a2 + 0.25]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma,lam", CONSTANTS)
def test_lfilter_equals_gae_right_padded(dtype, gamma, lam):
    pytest.importorskip("scipy")
    r, v, _ = bench.make_batch(7, 150, dtype, CPU, holes=False, seed=4)
    m = _right_padded_edges(7, 150, seed=5)
    got = bench.lfilter_gae(r, v, m, gamma, lam)
    want = _reference(r, v, m, gamma, lam)
    assert all(g.dtype == dtype and g.device == r.device for g in got)
    _assert_close_on(m, got, want, ATOL[dtype])
    assert bool((got[0][~m] == 0).all() and (got[1][~m] == 0).all())  # masked tokens: 0, as valuelab.gae


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma,lam", CONSTANTS)
def test_torchrl_equals_gae_right_padded(dtype, gamma, lam):
    pytest.importorskip("torchrl")
    assert bench._load_torchrl() is not None
    r, v, _ = bench.make_batch(7, 600, dtype, CPU, holes=False, seed=6)
    m = _right_padded_edges(7, 600, seed=7)
    got = bench.torchrl_gae(r, v, m, gamma, lam)
    want = _reference(r, v, m, gamma, lam)
    # TorchRL drops the terms of (gamma lam)^l below 1e-7: its error is bounded by the benchmark's tolerance
    tol = bench.tolerance(r, v, gamma, lam, bench.TORCHRL_THRESHOLD)
    assert tol < 1e-2
    agreement = bench.check_agrees("torchrl", got, want, m, tol)
    assert agreement.max_err <= tol
    if dtype == torch.float32:
        _assert_close_on(m, got, want, ATOL[dtype])
    assert bool((got[0][~m] == 0).all() and (got[1][~m] == 0).all())


def test_the_check_catches_another_computation():
    # the mask-blind loop bootstraps into the padding: not GAE of the right-padded rows
    r, v, m = bench.make_batch(8, 300, torch.float64, CPU, holes=False, seed=8)
    assert not bool(m.all())
    want = _reference(r, v, m, bench.GAMMA, bench.LAM)
    tol = bench.tolerance(r, v, bench.GAMMA, bench.LAM)
    with pytest.raises(bench.ContenderMismatch, match="loop"):
        bench.check_agrees("loop", bench.loop_gae(r, v, bench.GAMMA, bench.LAM), want, m, tol)
    # a value shifted by one token is caught too
    wrong = (want[0] + 1e-3, want[1])
    with pytest.raises(bench.ContenderMismatch):
        bench.check_agrees("shifted", wrong, want, m, tol)
    assert bench.check_agrees("itself", want, want, m, tol).max_err == 0.0


def test_tolerance_grows_with_truncation_and_precision():
    r, v, _ = bench.make_batch(2, 1000, torch.float64, CPU, holes=False)
    base = bench.tolerance(r, v, 1.0, 0.95)
    assert 0 < base < 1e-9
    assert bench.tolerance(r, v, 1.0, 0.95, bench.TORCHRL_THRESHOLD) > 1e3 * base
    assert bench.tolerance(r.float(), v.float(), 1.0, 0.95) > 1e6 * base


# ---------------------------------------------------------------------------
# the benchmark run, its files and its report
# ---------------------------------------------------------------------------


def _run_tiny(folder, name="b"):
    """``(rows, csv path, json, printed)`` of ``main`` on the one shape 2x40, CPU, float32."""
    out = folder / f"{name}.csv"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setattr(bench, "QUICK_GRID", [(2, 40)])
        rows = bench.main(["--quick", "--device", "cpu", "--dtype", "float32", "--out", str(out)])
    return rows, out, json.loads((folder / f"{name}.json").read_text()), printed.getvalue()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One benchmark run shared by the tests that only read what it wrote (each run starts a process: seconds)."""
    return _run_tiny(tmp_path_factory.mktemp("bench"))


def test_bench_smoke(tiny_run):
    rows, out, meta, printed = tiny_run
    assert len(rows) == 2 and {r["mask"] for r in rows} == {"right-padded", "holes"}
    header = out.read_text().splitlines()[0].split(",")
    assert header[:5] == ["device", "dtype", "B", "T", "mask"]
    # the columns chapter 9 reads, and the new ones
    assert {"loop_ms", "fast_ms", "torch_ms", "floor_ms", "loop/fast", "fast/floor", "torch/floor", "holes/rp",
            "faults"} <= set(header)
    assert {"verl_ms", "lfilter_ms", "torchrl_ms", "verl/fast", "lfilter/fast", "torchrl/fast",
            "kernel_threads", "fast_min/floor_min", "bytes", "run"} <= set(header)
    assert all(math.isfinite(r["loop/fast"]) and r["fast_min_ms"] <= r["fast_ms"] for r in rows)
    assert all(math.isfinite(r["verl/fast"]) and r["verl_min_ms"] <= r["verl_ms"] for r in rows)
    holes = [r for r in rows if r["mask"] == "holes"][0]
    assert math.isnan(holes["lfilter_ms"]) and math.isnan(holes["torchrl_ms"])  # right-padded rows only
    for key in ("cpu_model", "logical_cpus", "torch_threads", "torch", "cpu_capability", "mallopt", "command",
                "loadavg_at_start", "loadavg_at_end", "cpu_path"):
        assert key in meta, key
    # the targets' lines are printed when the grid has the target's shape
    lines = bench.target_report([dict(r, B=64, T=4096) for r in rows])
    assert len(lines) == 1 + len(bench.TARGETS) + 1
    for line, (ratio, *_rest) in zip(lines[1:], bench.TARGETS):
        assert ratio in line and ("met" in line or "n/a" in line)
    assert "agreement checks with valuelab.gae passed" in printed


def test_bench_times_the_libraries_when_installed(tiny_run):
    pytest.importorskip("scipy")
    pytest.importorskip("torchrl")
    rows, _, meta, _ = tiny_run
    rp = [r for r in rows if r["mask"] == "right-padded"][0]
    for name in ("lfilter", "torchrl"):
        assert math.isfinite(rp[f"{name}/fast"]) and 0 < rp[f"{name}_min_ms"] <= rp[f"{name}_ms"]
    # every mask-aware contender was checked against valuelab.gae, within its tolerance
    assert {c["contender"] for c in meta["checks"]} == {"verl", "lfilter", "torchrl"}
    assert all(0 <= c["max_err"] <= c["tol"] for c in meta["checks"])
    import scipy
    import torchrl

    assert meta["scipy"] == scipy.__version__ and meta["torchrl"] == torchrl.__version__


def test_json_records_commit_threads_and_versions(tiny_run):
    _, _, meta, _ = tiny_run
    assert meta["contenders_in"] == "a spawned process of their own"
    assert meta["contender_torch_threads"] == torch.get_num_threads()
    assert meta["git_commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", meta["git_commit"])
    assert meta["git_commit"] == bench.git_commit()
    assert meta["torch_threads"] == torch.get_num_threads()
    expected = _native.threads_for(2 * 40) if _native.available() else 0
    assert meta["kernel_threads"] == {"2x40": expected}
    for key in ("scipy", "torchrl"):
        assert key in meta and (meta[key] is None or isinstance(meta[key], str))


def test_git_commit_outside_a_checkout(tmp_path):
    assert bench.git_commit(tmp_path) == "unknown"


def test_git_commit_of_this_checkout():
    commit = bench.git_commit()
    if commit == "unknown":
        pytest.skip("not in a git checkout (or no git)")
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)


def test_kernel_threads():
    assert bench.kernel_threads(64, 4096, torch.float32, torch.device("cuda")) == 0
    assert bench.kernel_threads(64, 4096, torch.float16, CPU) == 0
    big = bench.kernel_threads(64, 1 << 20, torch.float32, CPU)
    if _native.available():
        assert big == _native.threads_for(64 << 20) == min(torch.get_num_threads(), 32)
    else:
        assert big == 0


def _block_import(tmp_path, monkeypatch, package):
    """Make ``package`` fail to import in processes started from now on (the contenders' spawned process)."""
    stub = tmp_path / "blocked" / package
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError('{package} blocked by the test')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "blocked"))


def test_bench_runs_without_torchrl(tmp_path, monkeypatch):
    _block_import(tmp_path, monkeypatch, "torchrl")
    rows, out, meta, printed = _run_tiny(tmp_path)
    assert all(math.isnan(r["torchrl_ms"]) and math.isnan(r["torchrl/fast"]) for r in rows)
    assert all(math.isfinite(r["verl/fast"]) for r in rows)  # the rest still runs
    assert meta["torchrl"] is None
    assert "torchrl" not in {c["contender"] for c in meta["checks"]}
    assert "note: torchrl cannot be imported: the torchrl column is n/a" in printed
    header, first = out.read_text().splitlines()[:2]
    assert first.split(",")[header.split(",").index("torchrl_ms")] == "nan"  # the CSV column is empty (NaN)
    line = [ln for ln in bench.target_report([dict(r, B=64, T=4096) for r in rows]) if "torchrl/fast" in ln][0]
    assert "n/a" in line and "met" not in line


def test_bench_runs_without_scipy(tmp_path, monkeypatch):
    _block_import(tmp_path, monkeypatch, "scipy")
    rows, _, meta, printed = _run_tiny(tmp_path)
    assert all(math.isnan(r["lfilter_ms"]) for r in rows) and meta["scipy"] is None
    assert "note: scipy is not installed: the lfilter column is n/a" in printed


def test_run_grid_in_process_without_torchrl(monkeypatch):
    # the same grid in this process, the loader patched: the contenders' code path for a missing library
    monkeypatch.setattr(bench, "_load_torchrl", lambda: None)
    checks = []
    rows = bench.run_grid([CPU], [(3, 50)], [torch.float64], loop_budget_s=0.05, fast_repeats=3,
                          log=lambda line: None, checks=checks)
    assert [r["mask"] for r in rows] == ["right-padded", "holes"]
    assert all(math.isnan(r["torchrl_ms"]) and math.isfinite(r["verl_ms"]) for r in rows)
    assert "torchrl" not in {c["contender"] for c in checks} and "verl" in {c["contender"] for c in checks}
    assert bench.contender_info()["missing"]["torchrl"] == "torchrl cannot be imported"


def test_contenders_run_in_a_process_of_their_own():
    with bench.contender_process(1, False) as call:
        info = call(bench.contender_info)
        timings, checks = call(bench.slow_contenders, 2, 30, "float32", "cpu", 0.01, 3)
        # a mismatch found there reaches this process as itself
        a = torch.zeros(2, 3, dtype=torch.float64)
        with pytest.raises(bench.ContenderMismatch, match="wrong"):
            call(bench.check_agrees, "wrong", (a + 1, a), (a, a), torch.ones(2, 3, dtype=torch.bool), 1e-6)
    assert info["pid"] != os.getpid() and info["torch_threads"] == 1
    assert {"loop", "verl", "lfilter", "torchrl"} <= set(timings)
    assert all(0 < timings[k][1] <= timings[k][0] for k in ("loop", "verl"))
    assert {c["contender"] for c in checks} >= {"verl"} and all(c["max_err"] <= c["tol"] for c in checks)


def test_a_wrong_contender_stops_the_run(monkeypatch):
    # the check runs before any timing
    monkeypatch.setattr(bench, "verl_gae", lambda r, v, m, gamma, lam: bench.loop_gae(r, v, gamma, lam))
    with pytest.raises(bench.ContenderMismatch, match="verl"):
        bench.slow_contenders(4, 200, "float64", "cpu", 0.01, 3)


def _target_rows(**ratios):
    base = {"device": "cpu", "dtype": "float32", "B": 64, "T": 4096, "loop/fast": 600.0, "lfilter/fast": 6.0,
            "torchrl/fast": 60.0, "fast_min/floor_min": 2.0, "holes/rp": float("nan"), "verl/fast": 900.0,
            "loop_ms": 60.0, "torch_ms": 1.0, "torch/floor": 10.0}
    rp = dict(base, mask="right-padded", **ratios)
    holes = dict(base, mask="holes", **{"holes/rp": ratios.pop("holes/rp", 1.5)})
    return [rp, holes]


def test_target_report_met_and_not_met():
    lines = bench.target_report(_target_rows())
    assert lines[0].startswith("targets (cpu, float32, B=64, T=4096")
    assert all(line.endswith("met)") and "NOT met" not in line for line in lines[1:6])
    lines = bench.target_report(_target_rows(**{"loop/fast": 499.0, "fast_min/floor_min": 3.5, "torchrl/fast": 49.0}))
    verdicts = {ln.split("=")[0].strip(): ("NOT met" in ln) for ln in lines[1:6]}
    assert verdicts == {"loop/fast": True, "lfilter/fast": False, "torchrl/fast": True, "fast_min/floor_min": True,
                        "holes/rp": False}
    assert "499x" in lines[1] and "3.50x" in lines[4]  # the measured values are printed
    assert bench.target_report([dict(r, T=1024) for r in _target_rows()]) == []  # no target row: no report


def test_torchrl_dropin_line():
    """The drop-in line: valuelab's TorchRL-signature GAE against TorchRL's, checked, then timed (a small shape here)."""
    pytest.importorskip("torchrl")
    res = bench.torchrl_dropin(4, 300, "float32", "cpu", budget_s=0.05, hi=5)
    assert res["rounds"] >= 5 and 0 <= res["max_err"] <= res["tol"] < 1e-2
    assert 0 < res["dropin_min_ms"] <= res["dropin_ms"] and 0 < res["torchrl_min_ms"] <= res["torchrl_ms"]
    assert res["ratio"] == pytest.approx(res["torchrl_min_ms"] / res["dropin_min_ms"])
    line = bench.dropin_report(res)
    assert line.startswith("torchrl drop-in (cpu, float32, (4, 300, 1), done 1/200)") and "torchrl/dropin = " in line
    assert ("NOT met" in line) == (res["ratio"] < bench.DROPIN_TARGET)


def test_torchrl_dropin_line_without_torchrl(monkeypatch):
    monkeypatch.setattr(bench, "_load_torchrl", lambda: None)
    assert bench.torchrl_dropin(4, 300, "float32", "cpu", budget_s=0.05) is None
    assert bench.dropin_report(None) == "torchrl drop-in: n/a (torchrl cannot be imported)"


def test_run_prints_the_dropin_line_when_the_grid_has_the_target_shape(monkeypatch, capsys):
    pytest.importorskip("torchrl")
    monkeypatch.setattr(bench, "TARGET", ("cpu", "float32", 2, 40))
    args = argparse.Namespace(quick=True, repeats=3, out=None, runs=1)
    bench._run(args, [], [CPU], [torch.float32], [(2, 40)], False, bench.in_process)
    assert "torchrl drop-in (cpu, float32, (2, 40, 1), done 1/200)" in capsys.readouterr().out
    bench._run(args, [], [CPU], [torch.float64], [(2, 40)], False, bench.in_process)  # not the target's dtype: no line
    assert "torchrl drop-in" not in capsys.readouterr().out


def test_byte_bound_counts_what_gae_and_the_floor_move():
    # GAE: rewards, values, a one-byte mask in; advantages, returns out. The floor: two in, one out.
    assert bench.byte_bound(torch.float32) == pytest.approx(17 / 12)
    assert bench.byte_bound(torch.float64) == pytest.approx(33 / 24)
    assert bench.byte_bound(torch.float32) != pytest.approx(5 / 3)  # not the mask counted as a float tensor


def _large_rows(ratios, dtype="float32", B=512, T=4096, kind="right-padded"):
    """Rows of one large shape, one per run, whose fast_min / floor_min are ``ratios``."""
    return [{"device": "cpu", "dtype": dtype, "B": B, "T": T, "mask": kind, "fast_min_ms": x, "floor_min_ms": 1.0,
             "bytes": 1.42, "run": i + 1} for i, x in enumerate(ratios)]


def test_large_report_takes_the_median_of_the_runs():
    lines = bench.large_report(_large_rows([1.5, 2.6, 1.9]), load=(0.5, 1.25))
    assert lines[0].startswith("large batches") and "median of 3 run(s)" in lines[0] and "0.50 -> 1.25" in lines[0]
    assert "= " + " 1.90x" in lines[1] and "runs 1.50, 2.60, 1.90" in lines[1] and lines[1].endswith(": met)")
    # the median decides, not the best or the first run
    assert bench.large_report(_large_rows([2.1, 1.5, 2.2]))[1].endswith("NOT met)")
    assert bench.large_report(_large_rows([2.0]))[1].endswith(": met)")  # the bound itself is met
    # one line per (dtype, shape, mask); other shapes and devices are left out
    rows = (_large_rows([1.0]) + _large_rows([3.0], dtype="float64", B=16, T=32768, kind="holes")
            + [dict(r, B=8) for r in _large_rows([9.0])] + [dict(r, device="cuda") for r in _large_rows([9.0])])
    lines = bench.large_report(rows)
    assert len(lines) == 3 and "float64" in lines[2] and "16x32768" in lines[2] and "NOT met" in lines[2]
    assert bench.large_report([dict(r, B=8) for r in _large_rows([1.0])]) == []


def test_runs_repeat_the_grid_and_are_numbered(tmp_path):
    out = tmp_path / "r.csv"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setattr(bench, "LARGE_SHAPES", ((2, 40),))
        rows = bench.main(["--device", "cpu", "--dtype", "float32", "--shapes", "2x40", "--runs", "2",
                           "--repeats", "3", "--out", str(out)])
    assert [r["run"] for r in rows] == [1, 1, 2, 2]
    assert all(math.isfinite(r["bytes"]) and r["floor_min_ms"] <= r["floor_ms"] for r in rows)
    meta = json.loads((tmp_path / "r.json").read_text())
    assert meta["large_targets"][0].startswith("large batches") and len(meta["large_targets"]) == 3
    assert "median of 2 run(s)" in printed.getvalue()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        bench.main(["--runs", "0"])


@pytest.mark.skipif(not _native.available(), reason="needs the C kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_raw_kernel_call_of_the_breakdown_computes_gae(dtype):
    r, v, m = bench.make_batch(3, 300, dtype, CPU, holes=True)
    warm = (torch.full_like(r, math.nan), torch.full_like(r, math.nan))
    bench._kernel_call(r, v, m, 2, warm)()
    want = bench.fast_gae(r, v, m, bench.GAMMA, bench.LAM)
    assert torch.equal(warm[0], want.advantages) and torch.equal(warm[1], want.returns)
    bench._kernel_call(r, v, m, 1)()  # fresh outputs: runs
    # first thing in a fresh process, before anything has loaded the kernel
    code = ("import torch, valuelab.lab.bench as b; r, v, m = b.make_batch(2, 40, torch.float64, torch.device('cpu'), "
            "holes=False); b._kernel_call(r, v, m, 1)()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(TypeError, match="values"):  # the boundary's own check, before C sees a pointer
        bench._kernel_call(r, v.long(), m, 1)


@pytest.mark.skipif(not _native.available(), reason="needs the C kernel")
def test_breakdown_times_every_piece_and_writes_json(tmp_path):
    out = tmp_path / "b.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        found = bench.main(["--breakdown", "--dtype", "float64", "--shapes", "4x300,2x40", "--repeats", "5",
                            "--out", str(out)])
    assert [(b["B"], b["T"], b["dtype"]) for b in found] == [(4, 300, "float64"), (2, 40, "float64")]
    for b in found:
        assert all(0 < b[k] < 1e3 for k in bench.BREAKDOWN) and 0 < b["front_door_us"] < 1e6 and b["faults"] >= 0
    saved = json.loads(out.read_text())
    assert saved["breakdown"] == found and saved["machine"]["command"].endswith(str(out))
    text = printed.getvalue()
    assert text.count("front door") == 2 and all(k in text for k in bench.BREAKDOWN)


def test_stored_runs_are_read_from_the_package_by_plain_name():
    machine, rows = bench.stored_run("bench_cpu_large")
    assert rows and {"fast_min_ms", "floor_min_ms", "run", "bytes"} <= set(rows[0]) and machine["large_targets"]
    found = bench.stored_breakdown()
    assert found["breakdown"] and all(set(bench.BREAKDOWN) <= set(b) for b in found["breakdown"])
    for bad in ("../bench_cpu", "bench cpu", 3):
        with pytest.raises(ValueError, match="plain name"):
            bench.stored_breakdown(bad)
    with pytest.raises(ValueError, match="no stored"):
        bench.stored_breakdown("nothing_here")
    with pytest.raises(ValueError, match="no stored"):
        bench.stored_run("nothing_here")
