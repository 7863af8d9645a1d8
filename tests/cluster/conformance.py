"""Upstream's own [sig-network] conformance tests against the real cluster, once per proxy and
mode (upstream kube-proxy first, then pyproxy; pyproxy's ebpf mode last), with e2e.test
v1.36.3 built from Go modules.

    python -m tests.cluster.conformance [--runs kube-proxy:iptables,pyproxy:iptables,...]
                                        [--out DIR] [--procs N] [--focus REGEX]

Brings the real cluster up (or reuses one that is up), deploys CoreDNS, then for each run
switches the cluster's proxy (tests/cluster/real.py: deploy one DaemonSet, remove the other)
and runs the selected tests with ginkgo in the lan namespace. Writes, under ``--out``: each
run's JUnit, ``summary.json`` and ``summary.md`` (test x proxy/mode: passed, failed, skipped
with the reason), and prints ``conformance <proxy> <mode>: N passed, N failed, N skipped``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster import host, real

# The [sig-network] conformance tests, and the Services granular checks (pod-to-service and
# node-to-service over TCP and UDP), which are not tagged [Conformance].
FOCUS = r"\[sig-network\].*\[Conformance\]|\[sig-network\] Networking Granular Checks: Services"
# Tests that need what this cluster does not have, as Cilium's and kind's jobs skip them:
# serial and disruptive tests (they restart nodes or components), feature-gated ones, and
# dual-stack (the cluster is IPv4 only; see README).
SKIP = (
    r"\[Serial\]|\[Disruptive\]|\[Feature:|\[FeatureGate:|\[Alpha\]|\[Beta\]|\[Slow\]"
    r"|IPv6|DualStack"
)
RUNS = (
    "kube-proxy:iptables",
    "pyproxy:iptables",
    "kube-proxy:nftables",
    "pyproxy:nftables",
    "pyproxy:ebpf",
)
DEFAULT_OUT = real.ROOT / "build" / "conformance"


def run_e2e(name: str, out: Path, procs: int, focus: str, skip: str = SKIP) -> Path:
    """One ginkgo run of e2e.test in the lan namespace; returns its JUnit file."""
    d = out / name
    subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True)
    argv = [
        "nsenter",
        f"--net=/run/netns/{real.LAN}",
        str(real.NODE_BIN / "ginkgo"),
        f"--procs={procs}",
        f"--focus={focus}",
        f"--skip={skip}",
        "--no-color",
        "--timeout=2h",
        str(real.NODE_BIN / "e2e.test"),
        "--",
        f"--kubeconfig={real.STATE / 'admin.kubeconfig'}",
        f"--kubectl-path={real.NODE_BIN / 'kubectl'}",
        "--provider=local",
        f"--report-dir={d}",
        "--disable-log-dump",
        "--dump-logs-on-failure=false",
        "--allowed-not-ready-nodes=0",
        f"--num-nodes={len(real.NODE_NAMES)}",
        "--minStartupPods=1",
    ]
    host.log(f"{name}: e2e.test ({procs} processes); output in {d / 'e2e.log'}")
    t0 = time.monotonic()
    with (d / "e2e.log").open("wb") as logf:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert p.stdout is not None
        progress(p.stdout.fileno(), logf, name, t0)
        p.wait()
    host.log(f"{name}: e2e.test ended with {p.returncode} after {time.monotonic() - t0:.0f}s")
    junit = next(iter(sorted(d.glob("junit*.xml"))), None)
    if junit is None:
        raise RuntimeError(f"{name}: no JUnit report in {d} (see {d / 'e2e.log'})")
    return junit


def progress(fd: int, logf: Any, name: str, t0: float) -> None:
    """Copy ginkgo's output to the log; print each failure, ginkgo's summary lines, and a
    count of finished specs (ginkgo marks each with a character, not a line) once a minute."""
    done, pending, last = 0, b"", time.monotonic()
    while True:
        if select.select([fd], [], [], 10)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
        else:
            chunk = b""
        logf.write(chunk)
        done += chunk.count("•".encode())
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").strip().lstrip("•").strip()
            if line.startswith(("[FAILED] [", "Ran ", "PASS", "FAIL!", "Test Suite")):
                print(f"  {name}: {line[:200]}", flush=True)
        if time.monotonic() - last > 60:
            last = time.monotonic()
            print(f"  {name}: {done} specs finished, {last - t0:.0f}s", flush=True)


def case_name(tc: ET.Element) -> str:
    """A JUnit test case's test name, without ginkgo's "[It] " node prefix."""
    return re.sub(r"^\[It\] ", "", tc.get("name", ""))


def results(
    junit: Path, focus: str, skip: str = SKIP, reasons: dict[str, str] | None = None
) -> dict[str, dict[str, str]]:
    """test name -> {status, reason}, for the tests the focus selects (ginkgo's report also
    lists every spec the focus left out, as skipped); a test in ``reasons`` (skipped by its
    name) is listed as skipped with that reason."""
    want = re.compile(focus)
    unwanted = re.compile(skip)
    out: dict[str, dict[str, str]] = {}
    for tc in ET.parse(junit).getroot().iter("testcase"):
        name = case_name(tc)
        if not want.search(name):
            continue
        if reasons and name in reasons:
            out[name] = {"status": "skipped", "reason": reasons[name]}
            continue
        if unwanted.search(name):
            continue
        failure = tc.find("failure")
        skipped = tc.find("skipped")
        if failure is not None:
            out[name] = {"status": "failed", "reason": (failure.get("message") or "")[:300]}
        elif skipped is not None:
            out[name] = {"status": "skipped", "reason": (skipped.get("message") or "")[:300]}
        else:
            out[name] = {"status": tc.get("status", "passed")}
    return out


def summarize(
    all_results: dict[str, dict[str, dict[str, str]]], durations: dict[str, float], out: Path
) -> None:
    (out / "summary.json").write_text(
        json.dumps({"runs": all_results, "seconds": durations}, indent=1, sort_keys=True)
    )
    runs = list(all_results)
    tests = sorted({t for r in all_results.values() for t in r})
    lines = ["| test | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for t in tests:
        cells = []
        for r in runs:
            res = all_results[r].get(t)
            if res is None:
                cells.append("—")
            elif res["status"] == "skipped":
                cells.append(f"skipped: {res.get('reason', '')[:80]}")
            else:
                cells.append(res["status"])
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append("")
    for r in runs:
        lines.append(f"- {r}: {line_for(r, all_results[r])}, {durations.get(r, 0):.0f} s")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def counts(res: dict[str, dict[str, str]]) -> tuple[int, int, int]:
    st = [r["status"] for r in res.values()]
    return st.count("passed"), st.count("failed"), st.count("skipped")


def line_for(run: str, res: dict[str, dict[str, str]]) -> str:
    p, f, s = counts(res)
    return f"{p} passed, {f} failed, {s} skipped"


def run_all(
    label: str,
    runs: list[tuple[str, str]],
    fam: str,
    focus: str,
    skip_of: Callable[[str], str],
    out: Path,
    procs: int,
    reasons_of: Callable[[str], dict[str, str]] | None = None,
    suffix: str = "",
    privileged: bool = False,
    prepare: Callable[[], None] | None = None,
) -> dict[str, dict[str, dict[str, str]]]:
    """Each (proxy, mode) of ``runs`` on one cluster of family ``fam`` (brought up, or reused
    if up), the tests ``focus`` selects less ``skip_of(mode)`` (``reasons_of(mode)``: the
    tests skipped by name, with why); writes the summaries and prints
    ``<label> <proxy> <mode><suffix>: N passed, N failed, N skipped`` per run, and all of them
    again at the end. ``prepare``: what the tests need in the cluster beyond CoreDNS, made
    once it is up (MetalLB)."""
    for proxy, mode in runs:
        if not real.supports(proxy, mode):
            raise SystemExit(f"unknown run {proxy}:{mode}")
    for b in ("e2e.test", "ginkgo", "coredns"):
        if not (real.NODE_BIN / b).exists():
            raise SystemExit(f"missing {real.NODE_BIN / b}: run tests/cluster/build.sh conformance")
    out.mkdir(parents=True, exist_ok=True)
    first_proxy, first_mode = runs[0]
    real.up(first_proxy, first_mode, fam)  # with CoreDNS
    if prepare:
        prepare()
    all_results: dict[str, dict[str, dict[str, str]]] = {}
    durations: dict[str, float] = {}
    lines = {}
    for proxy, mode in runs:
        name = f"{proxy}:{mode}"
        real.use_proxy(proxy, mode, privileged)
        t0 = time.monotonic()
        junit = run_e2e(name.replace(":", "-"), out, procs, focus, skip_of(mode))
        durations[name] = time.monotonic() - t0
        reasons = reasons_of(mode) if reasons_of else None
        all_results[name] = results(junit, focus, skip_of(mode), reasons)
        summarize(all_results, durations, out)
        lines[name] = f"{label} {proxy} {mode}{suffix}: {line_for(name, all_results[name])}"
        print(lines[name], flush=True)
    print(f"summary: {out / 'summary.md'}; the cluster stays up (make cluster-down removes it)")
    for line in lines.values():
        print(line)
    return all_results


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.cluster.conformance")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--focus", default=FOCUS)
    a = ap.parse_args(argv)
    runs = [(p, m) for p, _, m in (r.partition(":") for r in a.runs.split(","))]
    # ginkgo runs e2e.test in its own directory: a relative path would move.
    run_all("conformance", runs, "ipv4", a.focus, lambda mode: SKIP, a.out.resolve(), a.procs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
