"""Input pipelines: the framework-independent folder scan, and one loader per framework."""
