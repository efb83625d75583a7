"""The wire formats between the operator and the programs in its pods: the stager's exit codes and
progress, the trainers' progress lines, and the results upload's lines."""
