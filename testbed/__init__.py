"""The local test bed that the tests, the demo and the benchmarks share (e.g. Azurite, the operator run as a
process, simulated pod logs, waiting on the API server). Not part of the product: no image carries it."""
