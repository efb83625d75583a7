"""What the reconcile knows and records about one job: the observed children, the status, the
conditions, and the decision taken. Pure."""
