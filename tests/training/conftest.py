"""The training tests share one process with every other test (`make test` runs a single pytest).

TensorFlow and Triton (which torch loads the first time it sets up torch._dynamo, e.g. in an optimizer's
constructor) each carry their own LLVM: loading Triton's after TensorFlow's crashes the interpreter with a
segmentation fault, while the other order works. The images never hold both frameworks; here, Triton's is
loaded first, before any test module imports TensorFlow.
"""

from __future__ import annotations

import torch._dynamo  # noqa: F401  (for its side effect: Triton loads now, before TensorFlow)
