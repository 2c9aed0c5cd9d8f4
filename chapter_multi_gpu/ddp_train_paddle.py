r"""Train ResNet-18 on Fashion-MNIST with paddle.DataParallel, one per device.

Start it with PaddlePaddle's launcher from the book's root folder, for example

    python -m paddle.distributed.launch --nproc_per_node 2 \
        chapter_multi_gpu/ddp_train_paddle.py --epochs 10

The launcher sets the PADDLE_* variables that describe the process group in
every process; see the section on processes and process groups for the
multi-machine command line.
"""
import argparse
import pathlib
import sys

# The book's own d2l package lives one folder above this script, both in the
# repository and in the folder of downloaded notebooks.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from d2l import paddle as d2l  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--batch-size', type=int, default=512,
                        help='global minibatch, shared by all processes')
    parser.add_argument('--lr', type=float, default=0.2)
    parser.add_argument('--timeout', type=float, default=300,
                        help='seconds to wait for the other processes at '
                             'the rendezvous (on GPUs also at each exchange; '
                             "PaddlePaddle's Gloo has no timeout) "
                             '(default: %(default)g)')
    args = parser.parse_args()
    try:  # before any process waits for another
        d2l.check_count(args.epochs, '--epochs', 1)
        d2l.check_count(args.batch_size, '--batch-size', 1)
        d2l.check_number(args.lr, '--lr')
    except ValueError as err:
        parser.error(str(err))
    if not 0 < args.timeout < float('inf'):
        parser.error(f'--timeout must be a positive number of seconds, '
                     f'got {args.timeout}')
    rank, world_size, local_rank, local_world_size = d2l.launcher_ranks()
    with d2l.launcher_deadline(rank, world_size, args.timeout):
        summary = d2l.train_ddp(rank, world_size, 'env://', args.epochs,
                                args.batch_size, args.lr, local_rank,
                                local_world_size)
    if rank == 0:
        print(d2l.describe_ddp_run(summary), flush=True)


if __name__ == '__main__':
    main()
