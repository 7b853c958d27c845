"""Audit reports, Prometheus metrics and the goodput model, from real drills of the demo run
(some failing by injected faults), rendered for real: HTML in headless Chromium, metrics
through prometheus_client's own parser."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drill.replay import ReplaySpec
from drill.verdict import SLO
from tests.conftest import drill, invoke
from tests.support.faults import FaultyStorage, Flip

HOSTILE = "run <script>alert(1)</script> | `tick` *star* [x](y)"
"""A run directory name a report must print as text, never as markup."""


@pytest.fixture(scope="module")
def history_db(tmp_path_factory: pytest.TempPathFactory, pristine_run: Path) -> tuple[str, Path]:
    """Five drills of a demo run whose name is hostile: passed (replayed), failed twice by
    injected faults, an SLO breach, passed again."""
    base = tmp_path_factory.mktemp("reports")
    run = base / HOSTILE
    shutil.copytree(pristine_run, run)
    url = f"sqlite:///{base / 'drill.db'}"
    assert drill(run, url, replay=ReplaySpec(steps=2)).status == "passed"
    assert drill(run, url, storage=FaultyStorage({"__0_0.distcp": Flip(offset=4096)})).status == "failed"
    assert drill(run, url, "step:20", storage=FaultyStorage({"__0_1.distcp": Flip(offset=100)})).status == "failed"
    assert drill(run, url, "step:10", slo=SLO(max_restore_seconds=1e-6)).status == "slo_breach"
    assert drill(run, url, "step:20", replay=ReplaySpec(steps=2)).status == "passed"
    return url, run


def _sql_exec(url: str, statement: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(statement))
    engine.dispose()


def _report(url: str, *args: str) -> str:
    res = invoke(CliRunner(), "report", "--db", url, *args)
    assert res.exit_code == 0, res.stderr
    return res.stdout


@pytest.mark.slow
def test_the_json_report_holds_the_evidence(history_db: tuple[str, Path]) -> None:
    url, run = history_db
    doc = json.loads(_report(url, "-f", "json"))
    assert doc["schema"] == "drill.report/1" and doc["totals"]["drills"] == 5
    assert doc["totals"]["by_status"] == {"passed": 2, "failed": 2, "slo_breach": 1}
    (section,) = doc["runs"]
    assert section["run_root"] == str(run) and section["retention"] == "storage"
    rows = {c["name"]: c for c in section["checkpoints"]}
    assert [rows[n]["proven_restorable"] for n in ("step-10", "step-20", "step-30")] == [
        False,
        True,
        False,
    ]  # latest verdicts: slo_breach, passed, failed
    assert (
        rows["step-20"]["last_drill_id"] == 5
        and rows["step-20"]["evidence_level"] == "sealed"
        and rows["step-20"]["bytes_verified"] > 0
    )
    assert (
        section["coverage"]["retained"] == 3
        and section["coverage"]["drilled_in_window"] == 3
        and section["coverage"]["share"] == 1.0
    )
    assert (
        section["restore_seconds"]["n"] == 5
        and section["restore_seconds"]["p95"] >= section["restore_seconds"]["p50"] > 0
    )
    assert section["ttfs_seconds"]["n"] == 2
    failed = [d for d in section["drills"] if d["status"] == "failed"]
    assert [f["code"] for f in failed[0]["findings"] if f["check"] == "integrity"] == ["digest-mismatch"]
    assert failed[0]["rerun"] == f"drill run --checkpoint '{run}/step-30' --no-replay --db {url}"  # the drill as it ran
    replayed = section["drills"][0]["replay"]
    assert replayed["verdict"] == "passed" and replayed["steps"][0]["reference_loss"] == replayed["steps"][0]["loss"]
    assert (
        section["slo_breaches"][0]["drill_id"] == 4
        and "over the 1e-06 s target" in section["slo_breaches"][0]["breaches"][0]
    )
    assert section["goodput"]["restart_s"] > 0 and [r["gpus"] for r in section["goodput"]["rows"]] == [
        4096,
        16384,
        65536,
    ]
    assert doc["chain"]["intact"] and doc["chain"]["head"]["seq"] == 5


@pytest.mark.slow
def test_the_markdown_report_escapes_what_it_did_not_write(history_db: tuple[str, Path]) -> None:
    url, _ = history_db
    md = _report(url, "-f", "md")
    prose = re.sub(
        r"(?ms)^(`{3,})sh\n.*?\n\1$", "", md
    )  # commands stay literal inside code blocks, which never render markup
    assert (
        "<script>" not in prose
        and "&lt;script&gt;" in prose
        and "```sh\ndrill run --checkpoint 'run <script>" not in md
    )
    overview, heading = [line for line in md.splitlines() if line.startswith("## ")]
    assert overview == "## Overview"
    assert heading.endswith("/run &lt;script&gt;alert(1)&lt;/script&gt; \\| \\`tick\\` \\*star\\* \\[x\\](y)")
    for line in md.splitlines():
        if (
            line.startswith("| ") and "step-" in line and "step-" in line.split("|")[1]
        ):  # every checkpoint row keeps its columns
            header_cols = 12
            assert len(re.findall(r"(?<!\\)\|", line)) == header_cols + 1, line
    assert "drill run --checkpoint" in md and "### What your measured restore time costs" in md
    assert re.search(r"head `[0-9a-f]{64}` \(entry 5, drill #5\)", md)


def test_the_html_report_is_one_self_contained_escaped_file(history_db: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = history_db
    out = tmp_path / "report.html"
    res = invoke(CliRunner(), "report", "--db", url, "-o", str(out))
    assert res.exit_code == 0 and res.stdout == "" and f"wrote {out}: html, 5 drill(s)" in res.stderr
    html = out.read_text()
    assert html.count("<script") == 0 and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "default-src 'none'" in html and not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched
    assert html.count('<svg class="chart"') == 2 and '<svg class="strip"' in html
    assert "proven" in html and "Re-run:" in html and "What your measured restore time costs" in html


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of raw pixels of an 8-bit RGB/RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, rows, prev = zlib.decompress(idat), [], bytearray(width * bpp)
    stride = width * bpp
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            pred = {0: 0, 1: a, 2: b, 3: (a + b) // 2, 4: _paeth(a, b, c)}[f]
            line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line) if bpp == 3 else bytes(v for j, v in enumerate(line) if j % 4 != 3))
        prev = line
    return width, height, rows


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def test_the_html_report_renders_in_headless_chromium(history_db: tuple[str, Path], tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it where it can)")
    url, _ = history_db
    page = tmp_path / "report.html"
    _report(url, "-o", str(page))
    shot = tmp_path / "shot.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--hide-scrollbars",
        "--window-size=1100,1400",
    ]
    subprocess.run(
        [browser, *flags, f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True, timeout=120
    )
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1100, 1400)
    colors = {row[i : i + 3] for row in rows[::4] for i in range(0, len(row), 12)}
    assert len(colors) > 50  # text, tables and charts, not a blank or error page
    blue, green, red = bytes((0x25, 0x63, 0xEB)), bytes((0x15, 0x80, 0x3D)), bytes((0xDC, 0x26, 0x26))
    assert blue in colors and green in colors and red in colors  # the latency series, passed and failed verdicts drawn
    dom = subprocess.run(
        [browser, *flags, "--dump-dom", page.as_uri()], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count("<polyline") >= 2 and dom.count("<circle") >= 7 and "<script" not in dom


def test_a_database_with_no_drills_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    res = invoke(CliRunner(), "report", "--db", url)
    assert res.exit_code == 0 and "**No drills recorded** in this window." in res.stdout
    doc = json.loads(_report(url, "-f", "json"))
    assert doc["runs"] == [] and doc["totals"]["drills"] == 0
    assert "No drills recorded" in _report(url, "-f", "html")


def test_report_filters_and_bad_flags(history_db: tuple[str, Path], tmp_path: Path) -> None:
    url, run = history_db
    assert json.loads(_report(url, "-f", "json", "--policy", "nope"))["runs"] == []
    assert json.loads(_report(url, "-f", "json", "--root", str(run)))["totals"]["drills"] == 5
    idle = json.loads(_report(url, "-f", "json", "--since", "1s"))
    assert (
        idle["totals"]["drills"] == 0 and idle["runs"][0]["coverage"]["drilled_in_window"] == 0
    )  # a run that stopped being drilled shows
    for args, message in (
        (["-f", "pdf"], "--format: 'pdf' is not one of html, md, json"),
        (["--since", "soon"], "--since:"),
        (["-o", str(tmp_path / "no" / "r.html")], "--output: directory"),
        (["--gpus", "0"], "--gpus must be a whole number of GPUs"),
    ):
        res = invoke(CliRunner(), "report", "--db", url, *args)
        assert res.exit_code == 2 and message in res.stderr, (args, res.stderr)


# -- metrics --------------------------------------------------------------------------------
def test_the_metrics_textfile_parses_and_tells_the_state(history_db: tuple[str, Path], tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    url, run = history_db
    path = tmp_path / "drill.prom"
    assert invoke(CliRunner(), "audit", "verify", "--db", url).exit_code == 0  # the nightly full pass
    res = invoke(CliRunner(), "metrics", "--db", url, "--textfile", str(path))
    assert res.exit_code == 0 and f"series to {path}" in res.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["drill.prom"]  # written by rename: no temporary left
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(path.read_text())
        for s in f.samples
    }
    src = (("policy", ""), ("run_root", str(run)))
    assert samples[("drill_last_verdict", (*src, ("status", "passed")))] == 1.0
    assert samples[("drill_last_verdict", (*src, ("status", "failed")))] == 0.0
    assert samples[("drill_last_exit_code", src)] == 0.0
    assert 0 <= samples[("drill_last_success_age_seconds", src)] < 3600
    assert (
        samples[("drill_restore_seconds", src)] > 0
        and samples[("drill_ttfs_seconds", src)] > 0
        and samples[("drill_verified_bytes", src)] > 0
    )
    run_label = (("run_root", str(run)),)
    assert (
        samples[("drill_checkpoints_retained", run_label)] == 3
        and samples[("drill_checkpoints_proven", run_label)] == 1
    )
    assert samples[("drill_coverage_ratio", run_label)] == 1.0
    assert samples[("drill_audit_chain_intact", ())] == 1.0 and samples[("drill_audit_chain_entries", ())] == 5
    assert 0 <= time.time() - samples[("drill_audit_verified_timestamp_seconds", ())] < 3600


def test_metrics_never_verify_the_log_on_a_scrape_and_say_when_no_pass_was_recorded(
    history_db: tuple[str, Path], tmp_path: Path
) -> None:
    """``drill metrics`` re-checked the whole chain on every scrape until someone ran ``audit
    verify`` (17–19 CPU-s at 20,000 drills). A scrape reports the last full pass — none yet is
    not intact (fail closed) — and checks only the records it reads against their seals."""
    from prometheus_client.parser import text_string_to_metric_families

    from drill.records import audit

    url = f"sqlite:///{tmp_path / 'copy.db'}"
    shutil.copy(history_db[0].removeprefix("sqlite:///"), tmp_path / "copy.db")
    _sql_exec(url, "DELETE FROM audit_verified")  # the module's other tests may have run a pass
    path = tmp_path / "drill.prom"

    def scrape() -> dict[str, float]:
        assert invoke(CliRunner(), "metrics", "--db", url, "--textfile", str(path), "--no-list").exit_code == 0
        return {
            s.name: s.value
            for f in text_string_to_metric_families(path.read_text())
            for s in f.samples
            if s.name.startswith("drill_audit")
        }

    def untouchable(*a, **k):
        raise AssertionError("a scrape walked the audit log")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(audit, "verify_chain", untouchable)
        before = scrape()
    assert before["drill_audit_chain_intact"] == 0.0 and "drill_audit_verified_timestamp_seconds" not in before
    assert invoke(CliRunner(), "audit", "verify", "--db", url).exit_code == 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(audit, "verify_chain", untouchable)
        after = scrape()
    assert after["drill_audit_chain_intact"] == 1.0 and after["drill_audit_verified_timestamp_seconds"] > 0


def test_metrics_bad_paths(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    res = invoke(CliRunner(), "metrics", "--db", url, "--textfile", str(tmp_path / "absent" / "x.prom"))
    assert res.exit_code == 2 and "--textfile: directory" in res.stderr
    res = invoke(CliRunner(), "metrics", "--db", url, "--textfile", str(tmp_path / "x.txt"))
    assert res.exit_code == 0 and "node_exporter reads only *.prom files" in res.stderr


# -- goodput --------------------------------------------------------------------------------
def test_goodput_follows_young_daly() -> None:
    from drill.goodput import LLAMA3_MTBF_HOURS, goodput

    assert LLAMA3_MTBF_HOURS == pytest.approx(54 * 24 / 419)
    row = goodput(gpus=16384, blocking_s=60, restart_s=600, price_per_gpu_hour=2.0)
    m = 54 * 24 / 419 * 3600
    tau = (2 * 60 * m) ** 0.5
    assert row.interval_s == pytest.approx(tau) and row.mtbf_hours == pytest.approx(m / 3600)
    assert row.waste_fraction == pytest.approx(60 / tau + (tau / 2 + 600) / m)
    assert row.total_waste_cost_per_day == pytest.approx(row.waste_fraction * 16384 * 24 * 2.0)
    assert row.restart_cost_per_day == pytest.approx(600 / m * 16384 * 24 * 2.0)
    assert goodput(gpus=4096, blocking_s=60, restart_s=0).mtbf_hours == pytest.approx(4 * m / 3600)  # 1/N
    fixed = goodput(gpus=16384, blocking_s=60, restart_s=600, interval_s=3600)
    assert not fixed.optimal_interval and fixed.waste_fraction > row.waste_fraction  # τ* is the optimum


def test_goodput_cli_table_json_and_errors() -> None:
    res = invoke(
        CliRunner(),
        "goodput",
        "--json",
        "--gpus",
        "4096",
        "--gpus",
        "16384",
        "--gpus",
        "65536",
        "--blocking-s",
        "30",
        "--restart-s",
        "300",
        "--restart-s",
        "900",
    )
    rows = json.loads(res.stdout)["rows"]
    assert [(r["gpus"], r["restart_s"]) for r in rows] == [
        (4096, 300),
        (4096, 900),
        (16384, 300),
        (16384, 900),
        (65536, 300),
        (65536, 900),
    ]
    assert {
        "gpus",
        "mtbf_hours",
        "blocking_s",
        "restart_s",
        "interval_s",
        "waste_fraction",
        "checkpoint_stall_cost_per_day",
        "restart_cost_per_day",
        "total_waste_cost_per_day",
    } <= set(rows[0])
    assert (
        rows[0]["restart_cost_per_day"] is None and rows[0]["checkpoint_stall_cost_per_day"] is None
    )  # no price, no cost
    table = invoke(CliRunner(), "goodput", "--price-per-gpu-hour", "2")
    assert (
        table.exit_code == 0 and "65,536" in table.stdout and "$/year" in table.stdout and "ckpt stall" in table.stdout
    )
    for args, message in (
        (["--gpus", "-8"], "--gpus must be a whole number"),
        (["--mtbf-hours", "0"], "--mtbf-hours must be a positive number"),
        (["--blocking-s", "-1"], "--blocking-s (the blocking checkpoint time C) must be a positive number"),
        (["--restart-s", "-5"], "--restart-s must be zero or more"),
        (["--interval-s", "-3"], "--interval-s must be a positive number"),
        (["--interval-s", "nan"], "not a finite number"),
        (["--checkpoint-bytes", "2TB"], "add --policy"),
    ):
        res = invoke(CliRunner(), "goodput", *args)
        assert res.exit_code == 2 and message in res.stderr, (args, res.stderr)


@pytest.mark.slow
def test_goodput_takes_r_from_a_policys_drills(demo_run: Path, sqlite_url: str) -> None:
    measured = drill(demo_run, sqlite_url, replay=ReplaySpec(steps=1), policy="nightly")
    res = invoke(CliRunner(), "goodput", "--json", "--policy", "nightly", "--gpus", "16384", "--db", sqlite_url)
    doc = json.loads(res.stdout)
    ttfs = doc["restart"]["restart_s"]
    assert (
        res.exit_code == 0
        and ttfs > 0
        and doc["rows"][0]["restart_s"] == ttfs
        and "p95 time to first step of 1 drill" in doc["restart"]["how"]
    )
    assert "warm: these drills read from the page cache" in doc["restart"]["how"]  # no cold drill: said plainly
    assert "applied to 16,384 GPUs as it is" in res.stderr  # a one-process drill stretched to a big job: said
    res = invoke(
        CliRunner(),
        "goodput",
        "--json",
        "--policy",
        "nightly",
        "--checkpoint-bytes",
        "2TB",
        "--restore-bandwidth",
        "100GB/s",
        "--db",
        sqlite_url,
    )
    assert "R extrapolates" in res.stderr and "× the" in res.stderr
    scaled = json.loads(res.stdout)
    t = measured.timings
    assert scaled["restart"]["restart_s"] == pytest.approx(
        t.ttfs - t.restore + 20
    )  # the restore replaced by 2 TB at 100 GB/s
    res = invoke(CliRunner(), "goodput", "--policy", "other", "--db", sqlite_url)
    assert res.exit_code == 2 and "no drill of it has a time to first step" in res.stderr


@pytest.mark.slow
def test_a_finding_about_the_whole_drill_renders_in_every_format(
    demo_run: Path, sqlite_url: str, tmp_path: Path
) -> None:
    """A finding may name no subject (a replay that raised is about the drill, not a key):
    every report format renders it (once a KeyError in the Markdown report)."""
    from drill.replay import ReplaySpec
    from tests.conftest import drill as _drill

    outcome = _drill(
        demo_run,
        sqlite_url,
        replay=ReplaySpec(enabled=True, steps=1, entrypoint="tests.support.replay_targets:raising"),
    )
    assert any(f.subject is None for f in outcome.findings)
    runner = CliRunner()
    for fmt in ("md", "html", "json"):
        res = invoke(runner, "report", "--db", sqlite_url, "--format", fmt, "-o", str(tmp_path / f"r.{fmt}"))
        assert res.exit_code == 0, res.stderr
        assert "replay-error" in (tmp_path / f"r.{fmt}").read_text()


def test_an_audit_period_by_dates_in_csv_with_an_overview_first(history_db: tuple[str, Path]) -> None:
    """A fixed period (dates, not durations), CSV for a spreadsheet (no formula injection),
    and every report leads with one row per run, those needing attention first."""
    import csv
    import io
    from datetime import datetime, timedelta, timezone

    url, run = history_db
    today = datetime.now(timezone.utc).date()
    rows = list(csv.DictReader(io.StringIO(_report(url, "-f", "csv", "--since", str(today), "--until", str(today)))))
    assert len(rows) == 5 and {r["status"] for r in rows} == {"passed", "failed", "slo_breach"}
    assert all(r["rerun"].startswith("drill run ") and r["evidence_level"] in ("sealed", "structural") for r in rows)
    before = str(today - timedelta(days=3))
    assert list(csv.DictReader(io.StringIO(_report(url, "-f", "csv", "--since", before, "--until", before)))) == []
    bad = invoke(CliRunner(), "report", "--db", url, "--since", str(today), "--until", before)
    assert bad.exit_code == 2 and "not after --since" in bad.stderr
    tomorrow = str(today + timedelta(days=1))
    for since, n in ((str(today), 5), (before, 5), (tomorrow, 0), ("all", 5)):  # history takes --since as report does
        listed = invoke(CliRunner(), "history", "--db", url, "--since", since, "--json")
        assert listed.exit_code == 0 and len(json.loads(listed.stdout)) == n, (since, listed.stdout)
    bad = invoke(CliRunner(), "history", "--db", url, "--since", "soon")
    assert bad.exit_code == 2 and bad.stderr.startswith("drill: error: --since:"), bad.stderr
    html = _report(url, "-f", "html")
    assert html.index("<h2>Overview</h2>") < html.index('<h2 id="run-0">') and "oldest on the left" in html


def test_a_run_with_one_drill_gets_a_sentence_not_a_chart_of_one_dot(demo_run: Path, sqlite_url: str) -> None:
    from tests.conftest import drill as _drill

    _drill(demo_run, sqlite_url)
    html = _report(sqlite_url, "-f", "html")
    assert 'class="chart"' not in html and "One drill in the window" in html and 'class="strip"' in html


def test_goodput_prices_the_checkpoint_stall_apart_from_restarts_and_rework(cli) -> None:
    """The model's own source figure: 16,384 GPUs at $2.35/GPU-h, a 60 s blocking save every
    15 min: 96 stalls a day, ≈$61.6K/day and ≈$22.5M/year of idle GPUs — apart from restarts."""
    from tests.conftest import invoke

    args = ["goodput", "--gpus", "16384", "--interval-s", "900", "--blocking-s", "60", "--price-per-gpu-hour", "2.35"]
    res = invoke(cli, *args, "--json")
    (row,) = json.loads(res.stdout)["rows"]
    assert row["checkpoint_stall_cost_per_day"] == pytest.approx(16384 * 2.35 * 96 * 60 / 3600)  # $61,604
    assert row["checkpoint_stall_cost_per_year"] == pytest.approx(row["checkpoint_stall_cost_per_day"] * 365)
    parts = row["checkpoint_stall_cost_per_day"] + row["rework_cost_per_day"] + row["restart_cost_per_day"]
    assert parts == pytest.approx(row["total_waste_cost_per_day"])
    res = invoke(cli, *args)
    assert res.exit_code == 0 and "$61.6K" in res.stdout and "$22.5M" in res.stdout and "ckpt stall" in res.stdout


@pytest.mark.slow
def test_a_report_lists_the_newest_drills_and_the_failures_and_counts_them_all(history_db: tuple[str, Path]) -> None:
    """Past --drills N a run lists the newest N and the failures among the newest 2N in full;
    counts, percentiles, coverage and goodput still cover every drill of the window, and
    every format says which drills it lists."""
    url, _ = history_db
    doc = json.loads(_report(url, "-f", "json", "--drills", "1"))
    (section,) = doc["runs"]
    assert (
        doc["totals"]["drills"] == 5
        and section["drills_in_window"] == 5
        and section["counts"] == {"passed": 2, "failed": 2, "slo_breach": 1}
    )
    assert [d["id"] for d in section["drills"]] == [4, 5]  # the newest, and the slo_breach among the newest two
    assert section["restore_seconds"]["n"] == 5 and section["coverage"]["drilled_in_window"] == 3
    full = json.loads(_report(url, "-f", "json", "--drills", "all"))
    assert [d["id"] for d in full["runs"][0]["drills"]] == [1, 2, 3, 4, 5] and full["runs"][0][
        "checkpoints"
    ] == section["checkpoints"]
    assert "2 of the 5 drills in the window" in _report(url, "-f", "md", "--drills", "1")
    assert "Every drill in the window" in _report(url, "-f", "md")
    res = invoke(CliRunner(), "report", "--db", url, "--drills", "some")
    assert res.exit_code == 2 and "--drills: 'some' is neither a number of drills nor 'all'" in res.stderr


def test_records_outside_the_window_are_not_read_into_a_report(demo_run: Path, sqlite_url: str) -> None:
    """A report reads what its window holds: the run's checkpoints as drills saw them within
    it (without listing storage), and each checkpoint's latest drill by one query — however
    long the history before the window."""
    from datetime import datetime, timedelta, timezone

    import sqlalchemy as sa

    from drill.records.db import open_database

    for selector in ("step:10", "step:20", "step:30"):
        assert drill(demo_run, sqlite_url, selector).status == "passed"
    db = open_database(sqlite_url)
    old = datetime.now(timezone.utc) - timedelta(days=90)
    with db.engine.begin() as c:  # step-10 and its drill belong to last quarter
        c.execute(
            sa.text("UPDATE checkpoints SET last_seen = :t, first_seen = :t WHERE uri LIKE '%step-10'"), {"t": old}
        )
        c.execute(sa.text("UPDATE drills SET started_at = :t WHERE id = 1"), {"t": old})
    db.close()
    doc = json.loads(_report(sqlite_url, "-f", "json", "--no-list", "--since", "30d"))
    (section,) = doc["runs"]
    assert [c["name"] for c in section["checkpoints"]] == ["step-20", "step-30"] and section["drills_in_window"] == 2
    doc = json.loads(_report(sqlite_url, "-f", "json", "--no-list", "--since", "all"))
    assert [c["name"] for c in doc["runs"][0]["checkpoints"]] == ["step-10", "step-20", "step-30"]
    assert doc["runs"][0]["checkpoints"][0]["last_drill_id"] == 1
