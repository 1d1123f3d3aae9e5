"""Red-team answers for unit 18 (torch.distributed on gloo): written from the released exercise notebook, then the
wrong answers issue 40 named."""

from tests.redteam import Answer
from tests.redteam.edits import edited

# -- 18.ring_all_reduce -------------------------------------------------------------------------------------------

_RING_WHOLE = '''
def ring_all_reduce(tensor):
    r, p = dist.get_rank(), dist.get_world_size()
    acc, buf, got = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for _ in range(p - 1):
        ops = [dist.P2POp(dist.isend, buf, (r + 1) % p), dist.P2POp(dist.irecv, got, (r - 1) % p)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        buf = got.clone()
        acc += buf
    tensor.copy_(acc)
    return tensor
'''

_RING_STAR = '''
def ring_all_reduce(tensor):
    r, p = dist.get_rank(), dist.get_world_size()
    if r == 0:
        buf = torch.empty_like(tensor)
        for src in range(1, p):
            dist.recv(buf, src)
            tensor += buf
        for dst in range(1, p):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor
'''

# every rank sends its whole tensor to every other rank and sums what arrives: (p-1)·n per rank, to everyone
_RING_EVERYONE = '''
def ring_all_reduce(tensor):
    r, p = dist.get_rank(), dist.get_world_size()
    mine = tensor.clone()
    bufs = {q: torch.empty_like(tensor) for q in range(p) if q != r}
    ops = [dist.P2POp(dist.isend, mine, q) for q in bufs] + [dist.P2POp(dist.irecv, b, q) for q, b in bufs.items()]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    for b in bufs.values():
        tensor += b
    return tensor
'''

# reduce-scatter and all-gather done directly (chunk j goes straight to rank j): the ring's volume, but every rank
# talks to every other one
_RING_DIRECT = '''
def ring_all_reduce(tensor):
    r, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).chunk(p))
    got = {q: torch.empty_like(chunks[r]) for q in range(p) if q != r}
    ops = [dist.P2POp(dist.isend, chunks[q].clone(), q) for q in range(p) if q != r]
    ops += [dist.P2POp(dist.irecv, b, q) for q, b in got.items()]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    for b in got.values():
        chunks[r] += b
    ops = [dist.P2POp(dist.isend, chunks[r].clone(), q) for q in range(p) if q != r]
    ops += [dist.P2POp(dist.irecv, chunks[q], q) for q in range(p) if q != r]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return tensor
'''

# no point-to-point at all: the library collective under another name
_RING_C10D = '''
def ring_all_reduce(tensor):
    from torch.distributed import distributed_c10d
    distributed_c10d.all_reduce(tensor)
    return tensor
'''

_RING_PG = '''
def ring_all_reduce(tensor):
    pg = dist.distributed_c10d._get_default_group()
    pg.allreduce([tensor]).wait()
    return tensor
'''

# the known bypass of issue 40: the real gloo group behind the recording one, reached through its private attribute
_RING_INNER = '''
def ring_all_reduce(tensor):
    dist.group.WORLD._inner.allreduce([tensor]).wait()
    return tensor
'''

# only the reduce-scatter phase: each rank ends with one summed chunk, the rest partial
_RING_HALF = edited("18", "ring_all_reduce", ("    for gather in (0, 1):", "    for gather in (0,):"))

# -- 18.attach_data_parallel --------------------------------------------------------------------------------------

_SEED = "    torch.manual_seed(seed + dist.get_rank())\n"
_DIV = "        param.grad.div_(p)\n"


def _dp(*replacements):
    return edited("18", "attach_data_parallel", *replacements)


_DP_BACKWARD_HOOK = _dp((
    "    def average(param):\n"
    "        dist.all_reduce(param.grad)\n"
    "        param.grad.div_(p)\n"
    "\n"
    "    for param in module.parameters():\n"
    "        if param.requires_grad:\n"
    "            param.register_post_accumulate_grad_hook(average)\n",
    "    def average(mod, grad_input, grad_output):\n"
    "        for q in mod.parameters():\n"
    "            if q.grad is not None:\n"
    "                dist.all_reduce(q.grad)\n"
    "                q.grad.div_(p)\n"
    "\n"
    "    module.register_full_backward_hook(average)\n"))

# -- 18.ShardedAdamW ------------------------------------------------------------------------------------------------

_ZERO_FULL = '''
class ShardedAdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.inner = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.n = sum(p.numel() for p in self.params)

    def state_numel(self):
        return 2 * math.ceil(self.n / dist.get_world_size())

    @torch.no_grad()
    def step(self):
        ws = dist.get_world_size()
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= ws
        self.inner.step()
'''

_ZERO_SCATTER = ("        g = torch.empty(self.size)\n"
                 "        dist.reduce_scatter_single(g, flat([q.grad if q.grad is not None else torch.zeros_like(q)\n"
                 "                                            for q in self.params]))\n")


def _zero(*replacements):
    return edited("18", "ShardedAdamW", *replacements)


def _zero_all_reduced(reduce="dist.all_reduce(summed)"):
    """The whole flat gradient all-reduced (``reduce``), then this rank's share sliced out of it."""
    return _zero((_ZERO_SCATTER,
                  "        summed = flat([q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params])\n"
                  f"        {reduce}\n"
                  "        g = summed[self.r * self.size:(self.r + 1) * self.size].clone()\n"))


# a flat shard per rank, but moments allocated for all Ψ parameters (zeros outside the share)
_ZERO_ALL_SIZED = _zero(("        self.m = torch.zeros(self.size)\n        self.v = torch.zeros(self.size)\n",
                         "        self.m_all = torch.zeros(self.size * self.p)\n"
                         "        self.v_all = torch.zeros(self.size * self.p)\n"
                         "        self.m = self.m_all[self.r * self.size:(self.r + 1) * self.size]\n"
                         "        self.v = self.v_all[self.r * self.size:(self.r + 1) * self.size]\n"))

# the full moments kept on the parameters, where the optimizer's own attributes do not show them
_ZERO_ON_PARAMS = '''
class ShardedAdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        for p in self.params:
            p.exp_avg, p.exp_avg_sq = torch.zeros_like(p), torch.zeros_like(p)
        self.t = 0

    def state_numel(self):
        return 2 * math.ceil(sum(p.numel() for p in self.params) / dist.get_world_size())

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2 = self.betas
        ws = dist.get_world_size()
        for p in self.params:
            dist.all_reduce(p.grad)
            g = p.grad / ws
            p.exp_avg.mul_(b1).add_(g, alpha=1 - b1)
            p.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.mul_(1 - self.lr * self.wd)
            p.addcdiv_(p.exp_avg / (1 - b1 ** self.t), (p.exp_avg_sq / (1 - b2 ** self.t)).sqrt() + self.eps,
                       value=-self.lr)
'''

# whole parameters dealt out round-robin: unbalanced shares (one rank holds the 18-element weight)
_ZERO_ROUND_ROBIN = '''
class ShardedAdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.r, self.ws = dist.get_rank(), dist.get_world_size()
        self.owner = [i % self.ws for i in range(len(self.params))]
        mine = [p for p, o in zip(self.params, self.owner) if o == self.r]
        self.inner = torch.optim.AdamW(mine, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay) if mine else None

    def state_numel(self):
        return sum(2 * p.numel() for p, o in zip(self.params, self.owner) if o == self.r)

    @torch.no_grad()
    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= self.ws
        if self.inner is not None:
            self.inner.step()
        for p, o in zip(self.params, self.owner):
            dist.broadcast(p, o)
'''

# -- 18.row_parallel_linear -----------------------------------------------------------------------------------------

_ROW_FULL = '''
def row_parallel_linear(x, linear, rank, world_size):
    y = x @ linear.weight.T / world_size
    dist.all_reduce(y)
    return y + linear.bias
'''

# column-parallel (a slice of the output features) and one all-gather: right values, the wrong layout
_ROW_COLUMNS = '''
def row_parallel_linear(x, linear, rank, world_size):
    out = linear.out_features
    rows = [list(range(out))[q::world_size] for q in range(world_size)]
    n = max(len(r) for r in rows)
    idx = torch.tensor(rows[rank])
    part = F.linear(x, linear.weight[idx], linear.bias[idx])
    part = torch.cat([part, part.new_zeros(*part.shape[:-1], n - part.shape[-1])], dim=-1)
    got = [torch.empty_like(part) for _ in range(world_size)]
    dist.all_gather(got, part)
    y = x.new_empty(*x.shape[:-1], out)
    for q in range(world_size):
        y[..., rows[q]] = got[q][..., :len(rows[q])]
    return y
'''

_ROW_BROADCAST = '''
def row_parallel_linear(x, linear, rank, world_size):
    y = linear(x).detach().clone() if rank == 0 else x.new_empty(*x.shape[:-1], linear.out_features)
    dist.broadcast(y, 0)
    return y
'''

_ROW_BIAS_EVERY_RANK = edited("18", "row_parallel_linear", (
    "    partial = x[..., mine] @ linear.weight[:, mine].T\n",
    "    partial = x[..., mine] @ linear.weight[:, mine].T + linear.bias\n"), ("    return partial + linear.bias\n",
                                                                           "    return partial\n"))

# -- 18.tp_swiglu (written from the released exercise notebook, before the check existed) ------------------------

# forgot the backward communication: ∂x is only this rank's hidden slice's contribution
_TP_NO_DX_SUM = edited("18", "tp_swiglu", ("    xin = EnterRegion.apply(x)\n", "    xin = x\n"))
# the column-parallel layer's input all-reduced in the forward pass ("the region needs an all-reduce")
_TP_REDUCE_INPUT_FORWARD = edited("18", "tp_swiglu", (
    "        def forward(ctx, t):\n            return t.view_as(t)\n",
    "        def forward(ctx, t):\n            t = t.clone()\n            dist.all_reduce(t)\n            return t\n"), (
    "            grad = grad.clone()\n            dist.all_reduce(grad)\n            return grad\n",
    "            return grad\n"))
# the backward sum averaged like data parallelism's gradients
_TP_DX_AVERAGED = edited("18", "tp_swiglu", ("            dist.all_reduce(grad)\n",
                                             "            dist.all_reduce(grad)\n            grad /= dist.get_world_size()\n"))
# the output's all-reduce made differentiable: its backward sums the (already replicated) gradient again
_TP_OUTPUT_REDUCE_BOTH_WAYS = edited("18", "tp_swiglu", (
    "    dist.all_reduce(out)\n    return out\n",
    "    from torch.distributed.nn.functional import all_reduce\n    return all_reduce(out)\n"))
# one entry per column-parallel layer: gate and up each sum their own ∂x (right values, twice the backward traffic)
_TP_TWO_ENTRIES = edited("18", "tp_swiglu", (
    "    hidden = F.silu(xin @ ff.gate_proj.weight[mine].T) * (xin @ ff.up_proj.weight[mine].T)\n",
    "    hidden = F.silu(xin @ ff.gate_proj.weight[mine].T) * (EnterRegion.apply(x) @ ff.up_proj.weight[mine].T)\n"))
# lazy: gather every rank's shards into the full weights and run the dense block everywhere
_TP_GATHER_WEIGHTS = edited("18", "tp_swiglu", (
    "    xin = EnterRegion.apply(x)\n"
    "    hidden = F.silu(xin @ ff.gate_proj.weight[mine].T) * (xin @ ff.up_proj.weight[mine].T)\n"
    "    out = hidden @ ff.down_proj.weight[:, mine].T\n"
    "    dist.all_reduce(out)\n"
    "    return out\n",
    "    def full(w, dim):\n"
    "        own = w[mine] if dim == 0 else w[:, mine]\n"
    "        parts = [torch.empty_like(own) for _ in range(world_size)]\n"
    "        dist.all_gather(parts, own.detach().contiguous())\n"
    "        parts[rank] = own\n"
    "        return torch.cat(parts, dim)\n"
    "    gate, up, down = full(ff.gate_proj.weight, 0), full(ff.up_proj.weight, 0), full(ff.down_proj.weight, 1)\n"
    "    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T\n"))
# gate split by rows but down by rows too (the output features), then the slices all-gathered
_TP_DOWN_COLUMN_PARALLEL = edited("18", "tp_swiglu", (
    "    out = hidden @ ff.down_proj.weight[:, mine].T\n    dist.all_reduce(out)\n    return out\n",
    "    d = ff.down_proj.out_features // world_size\n"
    "    part = F.linear(hidden.new_zeros(*hidden.shape[:-1], ff.gate_proj.out_features).index_copy("
    "-1, torch.arange(mine.start, mine.stop), hidden), ff.down_proj.weight[rank * d:(rank + 1) * d])\n"
    "    out = torch.cat([part] * world_size, -1)\n"
    "    dist.all_reduce(out)\n    return out\n"))
# no way back for the gradient at all
_TP_DETACHED = edited("18", "tp_swiglu", ("    xin = EnterRegion.apply(x)\n", "    xin = x.detach()\n"))

# -- 18.expert_parallel_moe -----------------------------------------------------------------------------------------

_EP_GATHER = '''
def expert_parallel_moe(x, moe, rank, world_size):
    D = moe.d_model
    flat = x.reshape(-1, D)
    parts = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(parts, flat)
    allx = torch.cat(parts)
    _, w, idx = moe.gate(allx)
    per = moe.n_routed_experts // world_size
    out = torch.zeros_like(allx)
    for e in range(rank * per, (rank + 1) * per):
        tok, slot = torch.where(idx == e)
        if len(tok):
            out.index_add_(0, tok, moe.experts[e](allx[tok]) * w[tok, slot, None])
    dist.all_reduce(out)
    n = flat.shape[0]
    y = out[rank * n:(rank + 1) * n].view_as(x)
    return y + moe.shared_experts(x) if moe.shared_experts is not None else y
'''

_EP_GATHER_DUMMY = _EP_GATHER.replace("    dist.all_reduce(out)\n", """    dist.all_reduce(out)
    t = torch.zeros(world_size)
    dist.all_to_all_single(torch.empty_like(t), t)
""")

# every rank's tokens sent to every rank (the receivers route them again with the replicated gate)
_EP_ALL_TOKENS = '''
def expert_parallel_moe(x, moe, rank, world_size):
    D = moe.d_model
    flat = x.reshape(-1, D)
    n = torch.tensor([flat.shape[0]])
    counts = torch.empty(world_size, dtype=torch.long)
    dist.all_gather_into_tensor(counts, n)
    total = int(counts.sum())
    allx = flat.new_empty(total, D)
    dist.all_to_all_single(allx, flat.repeat(world_size, 1), counts.tolist(), [flat.shape[0]] * world_size)
    _, w, idx = moe.gate(allx)
    per = moe.n_routed_experts // world_size
    out = torch.zeros_like(allx)
    for e in range(rank * per, (rank + 1) * per):
        tok, slot = torch.where(idx == e)
        if len(tok):
            out.index_add_(0, tok, moe.experts[e](allx[tok]) * w[tok, slot, None])
    back = flat.new_empty(world_size * flat.shape[0], D)
    dist.all_to_all_single(back, out, [flat.shape[0]] * world_size, counts.tolist())
    y = back.view(world_size, flat.shape[0], D).sum(0).view_as(x)
    return y + moe.shared_experts(x) if moe.shared_experts is not None else y
'''

# all_to_all_single without split sizes: assumes every rank sends every other the same number of rows
_EP_EQUAL_SPLITS = '''
def expert_parallel_moe(x, moe, rank, world_size):
    D = moe.d_model
    flat = x.reshape(-1, D)
    _, w, idx = moe.gate(flat)
    k = idx.shape[1]
    per = moe.n_routed_experts // world_size
    flat_e = idx.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    token = order // k
    xs, es = flat[token], flat_e[order]
    rx, re_ = torch.empty_like(xs), torch.empty_like(es)
    dist.all_to_all_single(rx, xs)
    dist.all_to_all_single(re_, es)
    ry = torch.zeros_like(rx)
    for e in range(rank * per, (rank + 1) * per):
        m = re_ == e
        if m.any():
            ry[m] = moe.experts[e](rx[m])
    ys = torch.empty_like(xs)
    dist.all_to_all_single(ys, ry)
    out = torch.zeros_like(flat).index_add_(0, token, ys * w.reshape(-1)[order][:, None]).view_as(x)
    return out + moe.shared_experts(x) if moe.shared_experts is not None else out
'''

# the whole layer run locally (the experts of the other ranks used too); the all-to-all only for show
_EP_LOCAL = '''
def expert_parallel_moe(x, moe, rank, world_size):
    t = torch.zeros(world_size)
    dist.all_to_all_single(torch.empty_like(t), t)
    return moe(x)
'''


ANSWERS = [
    # ring_all_reduce
    Answer("18.ring_all_reduce", "the whole tensor passed around the ring p-1 times", _RING_WHOLE,
           bug="B18.ring_whole_tensor", origin="issue 40"),
    Answer("18.ring_all_reduce", "a star through rank 0 with send/recv", _RING_STAR,
           bug="B18.ring_not_neighbours", origin="issue 40"),
    Answer("18.ring_all_reduce", "every rank sends its whole tensor to every other", _RING_EVERYONE,
           bug="B18.ring_not_neighbours"),
    Answer("18.ring_all_reduce", "direct reduce-scatter/all-gather to every rank, not a ring", _RING_DIRECT,
           bug="B18.ring_not_neighbours"),
    Answer("18.ring_all_reduce", "the library all-reduce through distributed_c10d", _RING_C10D,
           says=r"calls the collective allreduce"),
    Answer("18.ring_all_reduce", "the process group's allreduce called directly", _RING_PG,
           says=r"calls the collective allreduce"),
    Answer("18.ring_all_reduce", "the real group behind the recording one (its private _inner)", _RING_INNER,
           says=r"communicated around the group", origin="issue 40"),
    Answer("18.ShardedAdamW", "the whole-gradient all-reduce sent through the unrecorded inner group",
           _zero_all_reduced("dist.group.WORLD._inner.allreduce([summed]).wait()"),
           says=r"communicated around the group", origin="issue 40"),
    Answer("18.ring_all_reduce", "reduce-scatter phase only", _RING_HALF, says=r"the tensor after the ring"),
    # attach_data_parallel
    Answer("18.attach_data_parallel", "broadcast + averaging hooks, seed ignored", _dp((_SEED, "")),
           bug="B18.seed_ignored", origin="issue 40"),
    Answer("18.attach_data_parallel", "gradients averaged twice", _dp(("param.grad.div_(p)", "param.grad.div_(p * p)")),
           bug="B18.grads_averaged_twice", origin="issue 40"),
    Answer("18.attach_data_parallel", "the same seed on every rank", _dp((_SEED, "    torch.manual_seed(seed)\n")),
           bug="B18.same_dropout_seed"),
    Answer("18.attach_data_parallel", "each rank seeded with its rank, seed ignored", _dp((_SEED, "    torch.manual_seed(dist.get_rank())\n")),
           bug="B18.seed_ignored"),
    Answer("18.attach_data_parallel", "seed * rank: rank 0's draws do not depend on seed",
           _dp((_SEED, "    torch.manual_seed(seed * dist.get_rank())\n")), bug="B18.seed_ignored"),
    Answer("18.attach_data_parallel", "a fresh random seed per rank (not reproducible)", _dp((_SEED, "    torch.seed()\n")),
           says=r"reproducible from `seed`"),
    Answer("18.attach_data_parallel", "gradients summed, not averaged", _dp((_DIV, "")),
           bug="B18.sum_not_mean"),
    Answer("18.attach_data_parallel", "parameters broadcast, buffers not",
           _dp(("list(module.parameters()) + list(module.buffers())",
                                                    "list(module.parameters())")), says=r"buffer 'scale' differs"),
    Answer("18.attach_data_parallel", "averaging in a module full backward hook", _DP_BACKWARD_HOOK,
           says=r"gradients of the first backward"),
    # ShardedAdamW
    Answer("18.ShardedAdamW", "a full AdamW on every rank, state_numel reporting the share", _ZERO_FULL,
           bug="B18.zero_full_state", origin="issue 40"),
    Answer("18.ShardedAdamW", "moments allocated for all parameters, only the share used", _ZERO_ALL_SIZED,
           bug="B18.zero_full_state"),
    Answer("18.ShardedAdamW", "full moments kept on the parameters", _ZERO_ON_PARAMS, bug="B18.zero_full_state"),
    Answer("18.ShardedAdamW", "whole parameters dealt round-robin (unbalanced)", _ZERO_ROUND_ROBIN,
           says=r"reports \d+ elements of optimizer state"),
    Answer("18.ShardedAdamW", "all-reduce of the whole gradient instead of its share", _zero_all_reduced(),
           bug="B18.zero_all_reduce"),
    # row_parallel_linear
    Answer("18.row_parallel_linear", "every rank computes the full product /p, one all-reduce", _ROW_FULL,
           bug="B18.row_full_product", origin="issue 40"),
    Answer("18.row_parallel_linear", "column-parallel with an all-gather", _ROW_COLUMNS,
           bug="B18.row_full_product"),
    Answer("18.row_parallel_linear", "rank 0 computes everything and broadcasts", _ROW_BROADCAST,
           bug="B18.row_full_product"),
    Answer("18.row_parallel_linear", "bias added on every rank before the all-reduce", _ROW_BIAS_EVERY_RANK,
           bug="B18.bias_every_rank"),
    # tp_swiglu (red team, from the exercise notebook)
    Answer("18.tp_swiglu", "no backward all-reduce: ∂x from this rank's hidden slice only", _TP_NO_DX_SUM,
           bug="B18.tp_dx_partial", origin="red team"),
    Answer("18.tp_swiglu", "the column-parallel input all-reduced in forward, identity backward",
           _TP_REDUCE_INPUT_FORWARD, bug="B18.tp_input_reduced_forward", origin="red team"),
    Answer("18.tp_swiglu", "∂x averaged over ranks instead of summed", _TP_DX_AVERAGED, bug="B18.tp_dx_averaged",
           origin="red team"),
    Answer("18.tp_swiglu", "a differentiable all-reduce at the output (sums the gradient again)",
           _TP_OUTPUT_REDUCE_BOTH_WAYS, bug="B18.tp_output_reduced_backward", origin="red team"),
    Answer("18.tp_swiglu", "gate and up each sum their own ∂x (two backward all-reduces)", _TP_TWO_ENTRIES,
           bug="B18.tp_dx_summed_per_layer", origin="red team"),
    Answer("18.tp_swiglu", "all-gather the weight shards, dense block on every rank", _TP_GATHER_WEIGHTS,
           bug="B18.tp_gather_weights", origin="red team"),
    Answer("18.tp_swiglu", "down split by output features too", _TP_DOWN_COLUMN_PARALLEL, says=r"NaN",
           origin="red team"),
    Answer("18.tp_swiglu", "x detached: no gradient reaches it", _TP_DETACHED, says=r"no gradient", origin="red team"),
    # expert_parallel_moe
    Answer("18.expert_parallel_moe", "all-gather the tokens, all-reduce, no all-to-all", _EP_GATHER,
           bug="B18.ep_no_all_to_all", origin="issue 40"),
    Answer("18.expert_parallel_moe", "all-gather + all-reduce with a dummy all-to-all", _EP_GATHER_DUMMY,
           bug="B18.ep_no_all_to_all"),
    Answer("18.expert_parallel_moe", "every token sent to every rank", _EP_ALL_TOKENS, says=r"routed to rank \d's experts"),
    Answer("18.expert_parallel_moe", "equal split sizes assumed", _EP_EQUAL_SPLITS, says=r"routed to rank \d's experts"),
    Answer("18.expert_parallel_moe", "the whole layer run locally", _EP_LOCAL, says=r"ran experts that live on the other rank"),
]
