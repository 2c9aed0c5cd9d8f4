r"""Train ResNet-18 on Fashion-MNIST with a dist_sync store, one worker each.

Start it from the book's root folder. With --workers it starts a job on this
machine, a scheduler, a server and that many workers running this script,
all listening on the loopback interface only:

    python chapter_multi_gpu/ddp_train_mxnet.py --workers 2 --epochs 10

Without --workers it is one worker of a job that DMLC_ROLE,
DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_WORKER and DMLC_NUM_SERVER
describe; see the section on processes and process groups for the
multi-machine command lines. (MXNet's own tools/launch.py calls
Thread.isAlive, which Python 3.9 removed.)
"""
import argparse
import os
import pathlib
import sys

# The book's own d2l package lives one folder above this script, both in the
# repository and in the folder of downloaded notebooks.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from d2l import mxnet as d2l  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workers', type=int, default=0,
                        help='start a job of this many workers on this '
                             'machine (default: be one worker of a job)')
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--batch-size', type=int, default=512,
                        help='global minibatch, shared by all processes')
    parser.add_argument('--lr', type=float, default=0.2)
    parser.add_argument('--timeout', type=float, default=300,
                        help='seconds to wait for the other workers when '
                             "joining the job (MXNet's store has no "
                             'timeout afterwards) (default: %(default)g)')
    args = parser.parse_args()
    try:  # before any process waits for another
        d2l.check_count(args.workers, '--workers')
        d2l.check_count(args.epochs, '--epochs', 1)
        d2l.check_count(args.batch_size, '--batch-size', 1)
        d2l.check_number(args.lr, '--lr')
    except ValueError as err:
        parser.error(str(err))
    if not 0 < args.timeout < float('inf'):
        parser.error(f'--timeout must be a positive number of seconds, '
                     f'got {args.timeout}')
    if args.workers and 'DMLC_ROLE' not in os.environ:  # the launcher
        sys.exit(d2l.launch_local_job(args.workers, sys.argv))
    d2l.LAUNCHER_JOIN_S = args.timeout  # the scheduler numbers the workers
    rank, world_size, local_rank, local_world_size = d2l.launcher_ranks()
    with d2l.launcher_deadline(rank, world_size, args.timeout):
        summary = d2l.train_ddp(rank, world_size, 'env://', args.epochs,
                                args.batch_size, args.lr, local_rank,
                                local_world_size)
    if rank == 0:
        print(d2l.describe_ddp_run(summary), flush=True)


if __name__ == '__main__':
    main()
