"""The DistributedTrainingJob API as the operator reads it: the parsed spec and its parsing. Pure."""
