"""The contracts between the operator and the programs in its pods: the stager's exit codes and progress, the
trainers' progress lines, the results upload's lines, and the training contract (frameworks, hyperparameters'
defaults and bounds) that the job's spec and the trainers' flags share."""
