"""Context parallelism: one sequence split across ranks, attention computed without gathering it.

Two ways to let a rank's queries see keys that live on other ranks:

=====================  ============================================  ==========================
function               how                                           limit
=====================  ============================================  ==========================
`ring_attention`       key/value blocks passed round a ring (p − 1   none on p; causal work is
                       isend/irecv per rank), online softmax          unbalanced over ranks
                       (Liu et al., 2023)
`ulysses_attention`    all-to-all to head shards, plain attention,    p ≤ n_head and p | n_head
                       all-to-all back (Jacobs et al., 2023)          (`check_heads`)
=====================  ============================================  ==========================

Both take and return ``(b, n_head, s_r, head_dim)`` shards of the sequence (`shard_sequence`,
`sequence_sizes`: the ``torch.tensor_split`` rule, so p need not divide s when ``seq_len`` is
given), equal `full_attention` on the concatenated sequence, forward and backward, and send
every message through `torch.distributed`, so `toolkit.comm.recording()` sees it.

    from toolkit.context_parallel import ring_attention, shard_sequence

    def work(rank, p, q, k, v):                  # the full (b, nh, s, d) tensors on every rank
        mine = [shard_sequence(t, rank, p) for t in (q, k, v)]
        return ring_attention(*mine, seq_len=q.shape[2])    # this rank's rows of the output

    spawn(work, 4, q, k, v)
"""

from .ring_attention import RingAttention, full_attention, ring_attention, sequence_sizes, \
    shard_sequence
from .ulysses import HeadToSequence, SequenceToHead, check_heads, ulysses_attention

__all__ = ["HeadToSequence", "RingAttention", "SequenceToHead", "check_heads", "full_attention",
           "ring_attention", "sequence_sizes", "shard_sequence", "ulysses_attention"]
