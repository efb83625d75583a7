"""One reconcile of one job: observe (the reads), then the pure core decides, then act (the writes)."""
