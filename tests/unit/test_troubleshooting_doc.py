"""docs/troubleshooting.md names every reason the operator can write: each condition reason and each Event
reason, read from the code by a scan of operator/dtjob, not from a list kept by hand.

Every reason reaches the API through a call of one of SINKS (an Event, a condition, a Blocker or a refusal
that becomes one, ...). The scan finds each such call and resolves its reason argument: a string literal, a
module-level constant (imported or not), either branch of `a if c else b` and each side of `a or b`. A
parameter that only passes a reason through (`reason` of a sink itself) is resolved at that sink's own calls.
What the scan cannot resolve must be named in CARRIED (the reason a carrier such as WorldFailure or Blocker
holds, whose constructions are scanned) or in COMPUTED (a set the code exposes as a constant); anything else
fails the test, so a new reason computed at run time cannot slip past the page.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dtjob.machine.world import LAUNCH_FAILED_REASONS, STARTUP_HOPELESS
from dtjob.state.status import CHILD_NOT_OURS, CREATE_FORBIDDEN, Phase

REPO = Path(__file__).resolve().parents[2]
CODE = REPO / "operator" / "dtjob"
PAGE = REPO / "docs" / "troubleshooting.md"
# The section of the page whose tables list the reasons: the first cell of each row names one.
SECTION = "## Reasons on a job"

# Everything a reason goes through on its way to the API, as "module:qualified name" of its definition; the
# reason is the parameter (or dataclass field) named `reason`.
SINKS = (
    "dtjob.state.decision:Event",  # an Event the reconcile posts
    "dtjob.state.status:Condition",
    "dtjob.state.status:set_condition",
    "dtjob.machine.builder:Builder.cond",
    "dtjob.machine.builder:Builder.cond_false_if_present",
    "dtjob.machine.builder:Builder.phase",  # an Event when the phase changes
    "dtjob.machine.finish:finish",
    "dtjob.machine.finish:invalid_spec",
    "dtjob.machine.refusals:_wait",
    "dtjob.machine.world:WorldFailure",
    "dtjob.state.decision:Refused",
    "dtjob.state.observed:Blocker",
    "dtjob.desired.pod_trust:Untrusted",
    "dtjob.gang.base:GangReport",
    "dtjob.reconcile.dispatch:_warn_once",
    "dtjob.kube.events:post_event",
    "dtjob.kube.client:Kube.emit_event",
    "dtjob.kube.client:KubeClient.emit_event",
    "dtjob.runtime.cached_kube:CachedKube.emit_event",
    "dtjob.runtime.election:Leases.announce",  # the Event on the operator's leader Lease
    "dtjob.kube.leases:LeaseClient.announce",
)
# Sinks that are methods, called on an object the scan cannot type (`b.cond(...)`, `kube.emit_event(...)`):
# matched by name, so every method of these names in operator/dtjob must be one of SINKS.
METHODS = frozenset({"cond", "cond_false_if_present", "phase", "emit_event", "announce"})

# (module, function, expression) -> the sink whose constructions hold the value: a reason read from a carrier
# object (or a local taken from one), each construction of which the scan resolves on its own.
CARRIED = {
    ("dtjob.machine.decide", "_blocked", "blocker.reason"): "dtjob.state.observed:Blocker",
    ("dtjob.reconcile.act", "act", "blocker.reason"): "dtjob.state.observed:Blocker",
    ("dtjob.reconcile.act", "_create_pods", "verdict.reason"): "dtjob.desired.pod_trust:Untrusted",
    ("dtjob.reconcile.preflight", "_untrusted", "verdict.reason"): "dtjob.desired.pod_trust:Untrusted",
    ("dtjob.machine.refusals", "refused", "refusal.reason"): "dtjob.state.decision:Refused",
    ("dtjob.machine.world", "fail_world", "reason"): "dtjob.machine.world:WorldFailure",
    ("dtjob.machine.staging", "stage", "refused.reason"): "dtjob.machine.world:WorldFailure",
    ("dtjob.machine.gang", "report_gang", "said.reason"): "dtjob.gang.base:GangReport",
    ("dtjob.reconcile.job", "_record", "event.reason"): "dtjob.state.decision:Event",
}
# (module, function, expression) -> every value it can take, from a constant of the code.
COMPUTED: dict[tuple[str, str, str], tuple[str, ...]] = {
    # A phase change's Event without a reason of its own is named after the phase.
    ("dtjob.machine.builder", "Builder.phase", "phase"): tuple(Phase),
    # Ready, Reconciling and Stalled repeat the phase, or the reason of the condition they are derived from
    # (Succeeded, Failed, Created), which the scan finds where that one is set.
    ("dtjob.state.conditions", "with_kstatus_conditions", "reason"): tuple(Phase),
    # A container that can never start fails the world under its own waiting reason.
    ("dtjob.machine.world", "startup_failure", "pod.waiting"): tuple(sorted(STARTUP_HOPELESS)),
    # A world's launch failed: its launcher's pod, or a torchrun world's worker.
    ("dtjob.machine.world", "_launcher_failure", "reason"): LAUNCH_FAILED_REASONS,
    # A condition read back from the stored status: its reason was written by one of the calls scanned.
    ("dtjob.state.status", "status_from_dict", "str(c.get('reason') or '')"): (),
    # The waits a startup deadline bounds: a create refused (403), a child's name another owner holds.
    ("dtjob.machine.refusals", "_bounded_wait", "reason"): (CREATE_FORBIDDEN, CHILD_NOT_OURS),
}

# Every dict literal of the code with a "reason" key, the way a reason could reach the API past SINKS (an
# Event or a condition built by hand), and why none of these is a reason of the job's of its own.
RAW_REASONS = {
    ("dtjob.kube.events", "post_event"): "the Event's body: the reason post_event was given (a sink)",
    ("dtjob.state.status", "Condition.to_dict"): "a condition as the status stores it (Condition is a sink)",
    ("dtjob.machine.staging", "stage"): "status.staging.reason: the stager's words on why it failed",
    ("dtjob.contract.transfer_report", "ProgressSnapshot.to_status"): "the same, from the stager's report",
    # On Kueue's Workload, not the job: Succeeded or Failed, as the job's phase.
    ("dtjob.desired.workload", "finished_conditions"): "the Finished condition of a MultiKueue Workload",
}


@dataclass
class Scan:
    reasons: dict[str, set[str]] = field(default_factory=dict)  # reason -> where the code writes it
    unresolved: list[str] = field(default_factory=list)  # "module, in function: expression"
    used: set[tuple[str, str, str]] = field(default_factory=set)  # the CARRIED and COMPUTED keys met


@dataclass(frozen=True)
class Sink:
    where: str  # "module:qualified name"
    position: int | None  # the reason's index among positional arguments; None: keyword only
    default: str | None  # the value when a call leaves it out


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(CODE.rglob("*.py")):
        parts = path.relative_to(CODE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(), filename=str(path))


def definitions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST, bool]]:
    """(qualified name, node, is a method) of every function and class, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield prefix + node.name, node, isinstance(tree, ast.ClassDef)
            yield from definitions(node, f"{prefix}{node.name}.")
        elif not isinstance(node, ast.expr):
            yield from definitions(node, prefix)


def reason_parameter(node: ast.AST, method: bool) -> tuple[int | None, str | None] | None:
    """(position, default) of a definition's `reason`, or None when it has none."""
    if isinstance(node, ast.ClassDef):  # a dataclass: its annotated fields, in order
        fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        names = [s.target.id for s in fields if isinstance(s.target, ast.Name)]
        if "reason" not in names:
            return None
        value = fields[names.index("reason")].value
        return names.index("reason"), _literal(value)
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    args = node.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]][1 if method else 0 :]
    if "reason" in positional:
        index = positional.index("reason")
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        return index, _literal(defaults[index])
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if arg.arg == "reason":
            return None, _literal(default)
    return None


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def sinks() -> dict[str, Sink]:
    found: dict[str, Sink] = {}
    for module, tree in modules():
        for qualified, node, method in definitions(tree):
            where = f"{module}:{qualified}"
            name = qualified.rsplit(".", 1)[-1]
            if where not in SINKS and not (method and name in METHODS):
                continue
            parameter = reason_parameter(node, method)
            assert parameter is not None, f"{where} is a sink, but has no parameter `reason`"
            assert where in SINKS, (
                f"{where}: a method named {name} must be one of SINKS (calls match by name)"
            )
            found[where] = Sink(where, *parameter)
    assert set(SINKS) <= set(found), f"SINKS not in the code: {set(SINKS) - set(found)}"
    for name in METHODS:
        positions = {s.position for w, s in found.items() if w.rsplit(".", 1)[-1] == name}
        assert len(positions) == 1, f"the methods named {name} take `reason` at different places"
    return found


def local_names(function: ast.AST) -> set[str]:
    """Every name a function binds (its parameters, assignments, loop, with, match and except targets), those
    of the functions and lambdas in it too: a name taken for local is never resolved as a constant."""
    bound: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.MatchAs | ast.MatchStar | ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


class Resolver:
    """Resolves the reason arguments of one module's sink calls."""

    def __init__(self, module: str, found: dict[str, Sink], scan: Scan) -> None:
        self.module = module
        self.globals = vars(importlib.import_module(module))  # what its names are bound to, imports too
        self.sinks = found
        self.objects = [(_object(where), sink) for where, sink in found.items()]
        self.scan = scan

    def sink_of(self, call: ast.Call, bound: frozenset[str]) -> Sink | None:
        callee = call.func
        if isinstance(callee, ast.Attribute) and not self._resolvable(callee, bound):
            if callee.attr not in METHODS:
                return None
            return next(s for w, s in self.sinks.items() if w.rsplit(".", 1)[-1] == callee.attr)
        if isinstance(callee, ast.Name | ast.Attribute) and self._resolvable(callee, bound):
            try:
                value = self._evaluate(callee)
            except (AttributeError, KeyError):
                return None
            return next((sink for obj, sink in self.objects if obj is value), None)
        return None

    def argument(self, call: ast.Call, sink: Sink) -> ast.expr | None:
        for keyword in call.keywords:
            if keyword.arg == "reason":
                return keyword.value
        if any(isinstance(a, ast.Starred) for a in call.args[: (sink.position or 0) + 1]):
            return call  # *args: where the reason is cannot be told (the call itself is unresolvable)
        if sink.position is not None and len(call.args) > sink.position:
            return call.args[sink.position]
        return None

    def values(self, expr: ast.expr, function: str, own: Sink | None, bound: frozenset[str]) -> Iterator[str]:
        """The strings `expr` can be; unresolvable ones are noted in the scan."""
        key = (self.module, function, ast.unparse(expr))
        if key in CARRIED or key in COMPUTED:
            self.scan.used.add(key)
            yield from COMPUTED.get(key, ())
        elif isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            yield expr.value
        elif isinstance(expr, ast.IfExp):
            yield from self.values(expr.body, function, own, bound)
            yield from self.values(expr.orelse, function, own, bound)
        elif isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
            for value in expr.values:
                yield from self.values(value, function, own, bound)
        elif isinstance(expr, ast.Name) and expr.id == "reason" and own is not None:
            pass  # the enclosing sink's own reason: resolved at its calls
        elif isinstance(expr, ast.Name | ast.Attribute) and self._resolvable(expr, bound):
            value = self._evaluate(expr)
            assert isinstance(value, str), f"{key}: not a string but {value!r}"
            yield str(value)
        else:
            self.scan.unresolved.append(f"{self.module}, in {function}: {ast.unparse(expr)}")

    def _resolvable(self, expr: ast.expr, bound: frozenset[str]) -> bool:
        """A chain of names whose root is the module's own (not bound in the function)."""
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        return isinstance(expr, ast.Name) and expr.id not in bound and expr.id in self.globals

    def _evaluate(self, expr: ast.expr) -> Any:
        if isinstance(expr, ast.Attribute):
            return getattr(self._evaluate(expr.value), expr.attr)
        assert isinstance(expr, ast.Name)
        return self.globals[expr.id]


def _object(where: str) -> Any:
    module, qualified = where.split(":")
    value: Any = importlib.import_module(module)
    for part in qualified.split("."):
        value = getattr(value, part)
    return value


def calls(tree: ast.AST, prefix: str = "", name: str = "", bound: frozenset[str] = frozenset()) -> Iterator[
    tuple[ast.Call, str, frozenset[str]]
]:  # fmt: skip
    """(call, qualified name of the function it is in, the names that function and those around it bind) of
    every call."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner = bound | local_names(node)
            yield from calls(node, f"{prefix}{node.name}.", prefix + node.name, inner)
        elif isinstance(node, ast.ClassDef):
            yield from calls(node, f"{prefix}{node.name}.", name, bound)
        else:
            if isinstance(node, ast.Call):
                yield node, name or "<module>", bound
            yield from calls(node, prefix, name, bound)


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def called_names(tree: ast.Module, sink_names: set[str]) -> set[str]:
    """The names a module may call a sink by: its own, or the one it imports it as."""
    aliases = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname and alias.name in sink_names
    }
    return sink_names | aliases


def scan() -> Scan:
    found = sinks()
    sink_names = {where.rsplit(":", 1)[-1].rsplit(".", 1)[-1] for where in found}
    result = Scan()

    def note(values: Iterable[str], where: str) -> None:
        for value in values:
            if value:
                result.reasons.setdefault(value, set()).add(where)

    for defined in found.values():
        note([defined.default or ""], defined.where)
    for module, tree in modules():
        names = called_names(tree, sink_names)
        resolver: Resolver | None = None
        for call, function, bound in calls(tree):
            if _called_name(call) not in names:
                continue  # the module is imported only for a call that may be a sink's
            resolver = resolver or Resolver(module, found, result)
            sink = resolver.sink_of(call, bound)
            if sink is None:
                continue
            where = f"{module}:{function}"
            expr = resolver.argument(call, sink)
            if expr is None:
                if any(k.arg is None for k in call.keywords):  # **kwargs may hold it
                    result.unresolved.append(f"{module}, in {function}: {ast.unparse(call)}")
                continue
            note(resolver.values(expr, function, found.get(where), bound), where)
    return result


@pytest.fixture(scope="module")
def scanned() -> Scan:
    return scan()


def documented(text: str) -> dict[str, int]:
    """The reasons the page's section lists (the first cell of each table row), with the line of each."""
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    first_line = text[:start].count("\n") + 1
    found: dict[str, int] = {}
    for number, line in enumerate(section.splitlines(), first_line):
        cells = line.split("|")
        if not line.startswith("|") or len(cells) < 3 or set(cells[1].strip()) <= {"-", " ", ":"}:
            continue
        for reason in re.findall(r"`([A-Za-z]+)`", cells[1]):
            assert reason not in found, f"{PAGE.name}:{number}: {reason} has a row already"
            found[reason] = number
    return found


def test_the_scan_resolves_every_reason_the_code_writes(scanned: Scan) -> None:
    assert not scanned.unresolved, (
        "reasons the scan cannot resolve: give them a constant, or name them in CARRIED or COMPUTED "
        "with where their values come from:\n  " + "\n  ".join(scanned.unresolved)
    )
    stale = (set(CARRIED) | set(COMPUTED)) - scanned.used
    assert not stale, f"CARRIED/COMPUTED entries the code no longer has: {sorted(stale)}"
    assert set(CARRIED.values()) <= set(SINKS)


def own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's own body, not those of the functions and classes defined in it."""
    for node in ast.iter_child_nodes(function):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node
            yield from own_nodes(node)


def raw_reasons() -> set[tuple[str, str]]:
    """(module, function) of every dict literal with a "reason" key."""
    found = set()
    for module, tree in modules():
        for qualified, node, _ in definitions(tree):
            for inner in own_nodes(node):
                keys = inner.keys if isinstance(inner, ast.Dict) else []
                if any(isinstance(k, ast.Constant) and k.value == "reason" for k in keys):
                    found.add((module, qualified))
    return found


def test_no_reason_reaches_the_api_past_the_sinks() -> None:
    found = raw_reasons()
    unknown = found - set(RAW_REASONS)
    assert not unknown, (
        f"dicts with a reason key the scan does not know (an Event or condition by hand?): {unknown}"
    )
    assert set(RAW_REASONS) <= found, f"RAW_REASONS the code no longer has: {set(RAW_REASONS) - found}"


def test_the_scan_finds_what_it_must(scanned: Scan) -> None:
    # One of each way a reason is written: a literal, a constant, an imported constant, a default, a computed
    # set, a carrier's construction.
    expected = {
        "LauncherSucceeded", "PodRefused", "CreateForbidden", "InvalidSpec", "InvalidImageName",
        "StorageCredentialsDenied", "SecretNotAllowed", "GangScheduleTimeout", "Preempted", "ReconcileError",
        "LeaderElected", "NoQueue", "Restarting", "Staging",
    }  # fmt: skip
    assert expected <= set(scanned.reasons), expected - set(scanned.reasons)


def test_the_page_has_a_row_for_every_reason_and_none_other(scanned: Scan) -> None:
    rows = documented(PAGE.read_text())
    missing = {r: sorted(w) for r, w in scanned.reasons.items() if r not in rows}
    assert not missing, f"{PAGE.relative_to(REPO)} has no row for these reasons (written by): {missing}"
    extra = {r: line for r, line in rows.items() if r not in scanned.reasons}
    assert not extra, f"{PAGE.relative_to(REPO)} has rows for reasons the code never writes: {extra}"


def test_a_row_taken_off_the_page_is_missed(scanned: Scan) -> None:
    text = PAGE.read_text()
    line = text.splitlines()[documented(text)["CreateForbidden"] - 1]
    assert "CreateForbidden" in scanned.reasons
    assert "CreateForbidden" not in documented(text.replace(line + "\n", ""))
