"""Mixture of experts and expert parallelism: a router sends each token to k of E experts; with
expert parallelism each rank holds E/ep of them and tokens travel by all-to-all.

    from toolkit.expert_parallel import ExpertParallelMoE, MoELayer
    moe = MoELayer(d_model=16, d_ff=32, num_experts=4, top_k=2, capacity_factor=1.25)
    out = moe(x, group_sizes=[5, 9])        # one process; out.y, out.aux_loss, out.stats
    ep = ExpertParallelMoE.from_dense(moe)  # in each of 2 ranks: experts 0-1 or 2-3
    out = ep(x_mine)                        # equals moe's rows of this rank's group

Sources: Shazeer et al., 2017 (the sparsely-gated layer), Lepikhin et al., 2020, "GShard" (top-2
gating, capacity per group, the all-to-all dispatch and combine), Fedus et al., 2022, "Switch
Transformers" (top-1, the capacity factor, the load-balancing loss of eq. 4); the routers of
2024-25: Dai et al., 2024, "DeepSeekMoE" (fine-grained and shared experts), Zoph et al., 2022,
"ST-MoE" (router z-loss), Wang et al., 2024 and DeepSeek-V3 (auxiliary-loss-free balancing,
node-limited routing). The formulas that start no process (capacity, dropped tokens, bytes per
rank and per node, fine-grained shapes) are `toolkit.cost.experts`.

==============  ================================================================================
module          holds
==============  ================================================================================
`router`        `route` (softmax or sigmoid, top-k, gates, slots, capacity; a balancing bias;
                node-limited choice), `Routing`, `slots`, `load_balancing_loss`,
                `router_z_loss`, `node_limited_mask`, `nodes_touched`
`balance`       auxiliary-loss-free balancing: `update_bias`, `balance_step` (the load
                all-reduced over ranks), `max_violation`, `simulate` (one process)
`stats`         `RouterStats` (tokens per expert, dropped, imbalance, padding), `router_stats`,
                `merge`
`experts`       `Experts`: E MLPs with stacked weights, `slice` for a rank's share;
                `SharedExperts` (DeepSeekMoE's shared experts, replicated)
`exchange`      `all_to_all` (all_to_all_single with uneven splits, or isend/irecv) and its
                differentiable `AllToAll`
`dispatch`      `dispatch` (tokens to their experts' ranks), `combine` (outputs back, gated), the
                two public functions a lab's reference wraps
`layer`         `MoELayer` on one process (groups), `MoEOutput`, `moe_forward`
`parallel`      `ExpertParallelMoE`, `reduce_gradients` (experts over edp, the rest over dp),
                `expert_process_groups` from a `planner.Layout` with ep
==============  ================================================================================
"""

from ..cost.experts import expert_capacity
from .balance import balance_step, max_violation, simulate, update_bias
from .dispatch import Dispatched, combine, dispatch
from .exchange import METHODS, AllToAll, all_to_all
from .experts import Experts, SharedExperts
from .layer import MoELayer, MoEOutput, moe_forward
from .parallel import (
    ExpertParallelMoE, dense_parameters, expert_parameters, expert_process_groups,
    reduce_gradients,
)
from .router import (
    SCORES, Routing, load_balancing_loss, node_limited_mask, nodes_touched, route, router_z_loss,
    slots,
)
from .stats import RouterStats, merge, router_stats

__all__ = ["METHODS", "SCORES", "AllToAll", "Dispatched", "ExpertParallelMoE", "Experts",
           "MoELayer", "MoEOutput", "RouterStats", "Routing", "SharedExperts", "all_to_all",
           "balance_step", "combine", "dense_parameters", "dispatch", "expert_capacity",
           "expert_parameters", "expert_process_groups", "load_balancing_loss", "max_violation",
           "merge", "moe_forward", "node_limited_mask", "nodes_touched", "reduce_gradients",
           "route", "router_stats", "router_z_loss", "simulate", "slots", "update_bias"]
