"""What GitOps tools see of a job: Argo CD's health check (docs/gitops.md, run in a real Lua 5.1), kstatus
(the sigs.k8s.io/cli-utils library Flux uses, built by hack/build-kstatus.sh), and no drift between an applied
manifest and the live job once the operator has reconciled it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.operator_harness import Jobs, OperatorProcess
from tests.gitops_jobs import PhaseCase, phase_cases
from tests.tools import REPO, kstatus, tool

pytestmark = pytest.mark.integration
HEALTH_KEY = "resource.customizations.health.dtjob.io_DistributedTrainingJob"
CASES = phase_cases()


def argo_health_check() -> str:
    """The Lua of the argocd-cm snippet in docs/gitops.md, exactly as a reader copies it."""
    text = (REPO / "docs" / "gitops.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if HEALTH_KEY in b]
    assert len(blocks) == 1, "docs/gitops.md must hold one argocd-cm snippet with the health check"
    script: str = yaml.safe_load(blocks[0])["data"][HEALTH_KEY]
    return script


def lua_literal(value: Any) -> str:
    """A Lua table constructor for a JSON value, as Argo CD hands the object to the script (`obj`)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = "".join(
            chr(b) if 32 <= b < 127 and chr(b) not in '"\\' else f"\\{b:03d}" for b in value.encode()
        )
        return f'"{escaped}"'
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    return "{" + ", ".join(f"[{lua_literal(str(k))}] = {lua_literal(v)}" for k, v in value.items()) + "}"


def lua() -> str:
    found = shutil.which("lua5.1")
    assert found, "lua5.1 is missing: `make deps` installs it (Debian package lua5.1)"
    return found


def argo_health(script: Path, job: dict[str, Any]) -> tuple[str, str]:
    harness = (
        f'obj = {lua_literal(job)}\nlocal hs = dofile("{script}")\nio.write(hs.status, "\\n", hs.message)\n'
    )
    done = subprocess.run([lua(), "-"], input=harness, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    status, message = done.stdout.split("\n", 1)
    return status, message


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_argo_cd_health_check_of_every_phase(case: PhaseCase, tmp_path: Path) -> None:
    script = tmp_path / "health.lua"
    script.write_text(argo_health_check())
    status, message = argo_health(script, case.job)
    assert status == case.argo, f"{case.name}: {status} ({message})"
    assert message, "the health check says why"
    if case.argo in ("Degraded", "Suspended", "Healthy"):
        stalled = [c for c in case.job["status"]["conditions"] if c["type"] == "Stalled"]
        assert message in (case.job["status"]["message"], stalled[0]["message"])


def test_the_argo_cd_health_check_waits_for_a_first_status(tmp_path: Path) -> None:
    script = tmp_path / "health.lua"
    script.write_text(argo_health_check())
    fresh = {k: v for k, v in CASES[0].job.items() if k != "status"}
    assert argo_health(script, fresh)[0] == "Progressing"


def kstatus_of(job: dict[str, Any]) -> dict[str, str]:
    done = subprocess.run([kstatus()], input=json.dumps(job), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kstatus_reads_every_phase(case: PhaseCase) -> None:
    result = kstatus_of(case.job)
    assert result["status"] == case.kstatus, f"{case.name}: {result}"


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("kubectl"), "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60
    )


def manifest(name: str) -> str:
    """A job as it would sit in Git: nothing defaulted, a launcher that runs for a while on kwok."""
    return yaml.safe_dump({
        "apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob", "metadata": {"name": name},
        "spec": {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4,
                 "launcher": {"podAnnotations": {"sim.dtjob.io/run-duration": "12s"}}},
    })  # fmt: skip


def test_applied_jobs_show_no_drift_and_kstatus_follows_them_live(
    jobs: Jobs, operator: OperatorProcess, kubeconfig: str, tmp_path: Path
) -> None:
    ns = jobs.ns
    # Client-side apply (Argo CD's default) and server-side apply under a field manager of its own (Flux).
    ways = {
        "drift-csa": (["apply"], ["diff"]),
        "drift-ssa": (["apply", "--server-side", "--field-manager=gitops"],
                      ["diff", "--server-side", "--field-manager=gitops"]),
    }  # fmt: skip
    files = {}
    for name, (apply, _) in ways.items():
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(manifest(name))
        done = kubectl(kubeconfig, *apply, "-n", ns, "-f", str(files[name]))
        assert done.returncode == 0, done.stderr

    def no_drift() -> None:
        for name, (_, diff) in ways.items():
            done = kubectl(kubeconfig, *diff, "-n", ns, "-f", str(files[name]))
            # kubectl diff: 0 = no differences, 1 = differences, >1 = an error.
            assert (done.returncode, done.stdout) == (0, ""), f"{name} drifted:\n{done.stdout}{done.stderr}"

    for name in ways:
        status = jobs.wait_phase(name, "Running", timeout=120)
        live = jobs.get(name) or {}
        assert status["observedGeneration"] == live["metadata"]["generation"]
        assert kstatus_of(live)["status"] == "InProgress"
    no_drift()

    for name in ways:
        jobs.wait_phase(name, "Succeeded", timeout=120)
        result = kstatus_of(jobs.get(name) or {})
        assert result["status"] == "Current", result
    no_drift()
