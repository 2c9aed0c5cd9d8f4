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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--k', type=int, default=2)
    args = parser.parse_args()
    rows = per_device_memory(args.k)
    print(table(rows))
    print(line(rows, args.k))


if __name__ == '__main__':
    main()
