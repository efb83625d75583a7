"""The job state machine: decide(spec, observed, previous status, now) -> new status + actions. Pure.

decide.py holds the order of the rules; world.py, staging.py and finish.py the rules themselves; results.py
and refusals.py what the actions' outcomes (a refusal included) make of the status once they ran.

A worker the cluster takes away (evicted from a lost node, collected with a deleted one) is WorkerLost, and an
old pod that stays terminating past its grace period (no kubelet left to confirm) is force-deleted, so the
next world is not held up until the node returns (world.py).
"""

from dtjob.machine.decide import decide, world_started
from dtjob.machine.finish import invalid_spec, wound_down
from dtjob.machine.results import settle, with_results

__all__ = ["decide", "invalid_spec", "settle", "with_results", "world_started", "wound_down"]
