"""The operator's runtime: the kopf handlers, the work queue and its lanes, the watches and caches of jobs
and children, leader election, health, metrics and heap trimming."""
