"""The job state machine: decide(spec, observed, previous status, now) -> new status + actions. Pure.

decide.py holds the order of the rules; world.py, staging.py and finish.py the rules themselves.
"""

from dtjob.machine.decide import decide, world_started
from dtjob.machine.finish import invalid_spec, with_results

__all__ = ["decide", "invalid_spec", "with_results", "world_started"]
