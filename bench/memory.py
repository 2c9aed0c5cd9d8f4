"""Per-device memory of DDP, ZeRO stages 1-3 and FSDP for ResNet-18 (sec_sharded_data_parallel).

usage: python -m bench.memory [--k K]

Every number is measured: the bytes of the tensors that one device (rank 0,
which holds the largest shard) stores between steps for parameters,
gradients and momentum-SGD state, in fp32. DDP and FSDP run one training
step in k Gloo processes on the CPU (NCCL processes on GPUs) with the book's
`fsdp_vs_ddp` worker; ZeRO-1/2/3 use the book's from-scratch `zero_init` on
ResNet-18's parameters. `line()` gives the one line that `make bench` prints.
"""
import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METHODS = ('DDP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3', 'FSDP')


def _check_k(k):
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f'k must be a positive integer number of devices, '
                         f'got {k!r}')


def zero_bytes(k=2):
    """Bytes per device of the from-scratch ZeRO stages 0-3 on ResNet-18's parameters."""
    _check_k(k)
    import torch
    from d2l import torch as d2l
    params = [p.detach() for p in d2l.resnet18(10).parameters()]
    devices = [torch.device('cpu')] * k  # bytes do not depend on the device
    return {stage: d2l.state_bytes(d2l.zero_init(params, devices, stage)[0])
            for stage in range(4)}


def framework_bytes(k=2):
    """Bytes on rank 0 under DDP and under FSDP after one step in k processes."""
    _check_k(k)
    from d2l import torch as d2l
    old = os.environ.get('D2L_QUICK')
    os.environ['D2L_QUICK'] = '1'  # the bytes do not depend on the data
    try:
        ranks = d2l.spawn_ranks(d2l.fsdp_vs_ddp, k, d2l.local_init_method(),
                                1, 4, 0.05)
    finally:
        if old is None:
            os.environ.pop('D2L_QUICK')
        else:
            os.environ['D2L_QUICK'] = old
    return {name: held for name, (held, _) in ranks[0].items()}


def per_device_memory(k=2, include_fsdp=True):
    """Rows of (method, parameter/gradient/state bytes, total, ratio to DDP) for ResNet-18."""
    zero = zero_bytes(k)
    measured = {f'ZeRO-{stage}': zero[stage] for stage in (1, 2, 3)}
    if include_fsdp:
        framework = framework_bytes(k)
        measured['DDP'] = framework['DDP']
        measured['FSDP'] = framework['FSDP']
    else:
        measured['DDP'] = zero[0]
    ddp_total = sum(measured['DDP'].values())
    rows = []
    for method in METHODS:
        if method not in measured:
            continue
        params, grads, state = measured[method].values()
        total = params + grads + state
        rows.append(dict(method=method, params=params, grads=grads,
                         state=state, bytes=total, ratio=total / ddp_total))
    return rows


def line(rows, k=2):
    """The one-line summary for `make bench`."""
    parts = ', '.join(f'{r["method"]} {r["bytes"] / 1e6:.1f} MB '
                      f'({r["ratio"]:.2f})' for r in rows)
    return (f'memory per device, ResNet-18, k = {k}, fp32 momentum SGD '
            f'(bytes, ratio to DDP): {parts}')


def table(rows):
    """A small text table of the rows."""
    out = [f'{"method":8}{"params MB":>11}{"grads MB":>10}{"state MB":>10}'
           f'{"total MB":>10}{"vs DDP":>8}']
    for r in rows:
        out.append(f'{r["method"]:8}{r["params"] / 1e6:11.1f}'
                   f'{r["grads"] / 1e6:10.1f}{r["state"] / 1e6:10.1f}'
                   f'{r["bytes"] / 1e6:10.1f}{r["ratio"]:8.2f}')
    return '\n'.join(out)


def _kept_bytes(blocks, X, recompute):
    """Bytes autograd keeps in a forward pass of the blocks (saved-tensor hooks)."""
    import torch
    from torch.utils.checkpoint import checkpoint
    weights = {p.data_ptr() for blk in blocks for p in blk.parameters()}
    found = {}
    def keep(t):
        if t.data_ptr() not in weights:
            found[t.data_ptr()] = t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        H = X
        for blk in blocks:
            H = checkpoint(blk, H, use_reentrant=False) if recompute \
                else blk(H)
    return sum(found.values())


def peak_rows(k=2, L=4, h=64, a=4, s=64, b=8):
    """Measured and predicted peak bytes per process of L transformer blocks (sec_memory_model)."""
    _check_k(k)
    import torch
    from d2l import torch as d2l
    blocks = [d2l.TransformerBlock(h, a) for _ in range(L)]
    params = [p.detach() for blk in blocks for p in blk.parameters()]
    n = sum(p.numel() for p in params)
    devices = [torch.device('cpu')] * k
    state = {stage: sum(d2l.state_bytes(
        d2l.zero_init(params, devices, stage)[0]).values()) for stage in (0, 3)}
    predicted_state = {0: 12 * n, 3: 12 * n / k}  # momentum SGD: 4 + 4 + 4
    X = torch.zeros(b, s, h)
    A, x = d2l.block_activation_bytes(s, b, h, a), 4 * s * b * h
    act = {False: _kept_bytes(blocks, X, False),
           True: _kept_bytes(blocks, X, True) + _kept_bytes(blocks[:1], X,
                                                           False)}
    predicted_act = {False: L * A, True: L * x + A}
    return [dict(method=name, recompute=r, measured=state[stage] + act[r],
                 predicted=predicted_state[stage] + predicted_act[r])
            for name, stage, r in (('DDP', 0, False), ('ZeRO-3', 3, False),
                                   ('DDP', 0, True), ('ZeRO-3', 3, True))]


def peak_line(rows, k=2):
    """The one-line summary of measured and predicted peak memory for `make bench`."""
    parts = ', '.join(
        f'{r["method"]}{" + recompute" if r["recompute"] else ""} '
        f'{r["measured"] / 2**20:.2f}/{r["predicted"] / 2**20:.2f}'
        for r in rows)
    return (f'peak memory per process, 4 transformer blocks, k = {k}, '
            f'measured/predicted MB: {parts}')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--k', type=int, default=2)
    args = parser.parse_args()
    rows = per_device_memory(args.k)
    print(table(rows))
    print(line(rows, args.k))
    print(peak_line(peak_rows(args.k), args.k))


if __name__ == '__main__':
    main()
