"""Activation checkpointing (recomputation): memory saved, time paid, the √L rule.

Sources: Chen, Xu, Zhang & Guestrin, 2016, "Training Deep Nets with Sublinear Memory Cost"
(arXiv:1604.06174), sections 3-4; Korthikanti et al., 2022, "Reducing Activation Recomputation
in Large Transformer Models" (arXiv:2205.05198), §4 (full recomputation keeps only each layer's
input, 2·s·b·h bytes in 16-bit) and §5 (selective recomputation of the attention core).

Backward needs tensors that forward computed (a matmul's input, a softmax's output, ...);
autograd keeps them from forward to backward, and for a transformer they dwarf the weights.
Checkpointing a segment of k blocks keeps only the segment's input; backward runs the segment's
forward again to get the rest back, then its backward. With L blocks in segments of k:

    memory ≈ ⌈L/k⌉ segment inputs (held all along)  +  k blocks' internals (one segment at a time)

smallest at k = √L when an input costs as much as a block's internals, for one extra forward
per step (Chen's model is pure memory arithmetic: `toolkit.memory.checkpointing`; every case
measured on CPU ranks beside it: `toolkit.experiments.recompute.sweep`). A transformer block
keeps far more inside than its input, so there the best k is about √(L·input/internals), often
1; selective recomputation reruns only the attention core.

==============  ===================================================================================
module          holds
==============  ===================================================================================
`wrappers`      `CheckpointedGPT` (segments, selective, flash-style attention), `CheckpointedMLP`
`measure`       `saved_bytes`, `measure` (one step in this process)
==============  ===================================================================================

    model = CheckpointedGPT(TinyGPT(GPTConfig(n_layer=16)), every=4)   # 4 segments of 4
    logits, loss = model(x, y)                                         # as TinyGPT
"""

from ..memory.checkpointing import best_every, chen_memory, segment_sizes
from .measure import StepMeasure, checkpointed, measure, saved_bytes
from .wrappers import CheckpointedGPT, CheckpointedMLP

__all__ = ["CheckpointedGPT", "CheckpointedMLP", "StepMeasure", "best_every", "checkpointed",
           "chen_memory", "measure", "saved_bytes", "segment_sizes"]
