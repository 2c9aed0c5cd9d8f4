"""Tests of the claims of chapter_multi_gpu/cluster.md (sec_cluster).

Each tab's Slurm batch script runs for real on a one-machine Slurm (Debian's
slurmctld, slurmd and munge, which `make setup` installs when run as root):
the fixture starts the daemons in a private folder on free ports and stops
them afterwards. Each tab's Kubernetes manifest is checked against the
Kubernetes API schema, and its pods' commands run here as two processes.
"""
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from test_process_groups import BRIEF_DATA, free_port, shell_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / 'chapter_multi_gpu' / 'cluster.md'
SBIN = ('/usr/sbin', '/usr/bin', '/sbin')


def tab_blocks(framework, language):
    """The ```language blocks of the page: those in `framework`'s tab, then the shared ones."""
    text = PAGE.read_text()
    tabbed = re.compile(r'^:begin_tab:`([^`]*)`\n(.*?)^:end_tab:', re.M | re.S)
    block = re.compile(rf'^```{language}\n(.*?)^```', re.M | re.S)
    own = [b for tabs, body in tabbed.findall(text)
           if framework in [t.strip() for t in tabs.split(',')]
           for b in block.findall(body)]
    return own, block.findall(tabbed.sub('', text))


def brief(text, port, epochs=1):
    """`text` as this CPU-only machine runs it: `epochs` epochs, one process per node, `port` for the rendezvous."""
    # arguments may be joined by NUL characters
    text = re.sub(r'(--epochs[\s\0]+)10\b', rf'\g<1>{epochs}', text)
    text = re.sub(r'(--nproc[-_]per[-_]node[\s\0=]+)8\b', r'\g<1>1', text)
    return re.sub(r'\b(29500|49178|9091)\b', str(port), text)


def program(name):
    for folder in SBIN:
        if os.access(os.path.join(folder, name), os.X_OK):
            return os.path.join(folder, name)
    return None


def stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope='module')
def slurm():
    """A one-machine Slurm cluster (controller, node daemon, munge) in a private folder: its environment."""
    names = ('munged', 'slurmctld', 'slurmd', 'sbatch')
    missing = [name for name in names if not program(name)]
    if missing:
        pytest.skip(f'{", ".join(missing)} not installed: run make setup as '
                    'root (it installs slurm-wlm and munge)')
    if os.geteuid() != 0:
        pytest.skip('slurmd runs jobs as their user only when started by root')
    host = socket.gethostname().split('.')[0]
    try:
        socket.gethostbyname(host)
    except OSError:
        pytest.skip(f'this machine\'s name {host} does not resolve, and '
                    'Slurm names its nodes by it')
    # munged wants every folder above its socket open to all (x), which
    # pytest's own temporary folders are not
    home = pathlib.Path(tempfile.mkdtemp(prefix='d2l-slurm-'))
    home.chmod(0o711)
    for sub in ('state', 'spool', 'log'):
        (home / sub).mkdir()
    key = home / 'munge.key'
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = home / 'munge.sock'
    conf = home / 'slurm.conf'
    conf.write_text('\n'.join([
        'ClusterName=book', f'SlurmctldHost={host}',
        f'SlurmctldPort={free_port()}', f'SlurmdPort={free_port()}',
        'SlurmUser=root', 'AuthType=auth/munge', 'CredType=cred/munge',
        f'AuthInfo=socket={sock}', f'StateSaveLocation={home}/state',
        f'SlurmdSpoolDir={home}/spool',
        f'SlurmctldPidFile={home}/slurmctld.pid',
        f'SlurmdPidFile={home}/slurmd.pid',
        f'SlurmctldLogFile={home}/log/slurmctld.log',
        f'SlurmdLogFile={home}/log/slurmd.log',
        'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none',
        'SelectType=select/cons_tres', 'SelectTypeParameters=CR_CPU',
        'MpiDefault=none', 'ReturnToService=2',
        'JobAcctGatherType=jobacct_gather/none',
        f'NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN',
        'PartitionName=book Nodes=ALL Default=YES MaxTime=10 State=UP', '']))
    env = shell_env(SLURM_CONF=str(conf))
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 env=env, start_new_session=True)
    daemons = [subprocess.Popen(
        [program('munged'), '-F', f'--socket={sock}', f'--key-file={key}',
         f'--pid-file={home}/munged.pid', f'--seed-file={home}/munge.seed',
         f'--log-file={home}/log/munged.log'], **quiet)]
    try:
        until = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < until:
            time.sleep(0.1)
        daemons += [subprocess.Popen([program(name), '-D', '-f', str(conf)],
                                     **quiet)
                    for name in ('slurmctld', 'slurmd')]
        state = ''
        until = time.monotonic() + 60
        while state != 'idle' and time.monotonic() < until:
            time.sleep(0.5)
            state = subprocess.run(
                ['sinfo', '-h', '-o', '%t'], env=env, capture_output=True,
                text=True).stdout.strip()
        assert state == 'idle', (
            f'the one-machine Slurm did not come up (node state {state!r}):'
            + ''.join(f'\n{log.name}: {log.read_text()[-1500:]}'
                      for log in sorted((home / 'log').glob('*.log'))))
        yield env
    finally:
        subprocess.run(['scancel', '--full', '--partition=book'], env=env,
                       capture_output=True)
        stop(daemons[::-1])
        shutil.rmtree(home, ignore_errors=True)


def wait_for_job(job, env, deadline_s):
    """The fields of `scontrol show job` once the job has ended; cancel it at the deadline."""
    until = time.monotonic() + deadline_s
    while True:
        shown = subprocess.run(['scontrol', '-o', 'show', 'job', job], env=env,
                               capture_output=True, text=True).stdout
        state = dict(re.findall(r'(\w+)=(\S*)', shown))
        if state.get('JobState') not in ('PENDING', 'RUNNING', 'COMPLETING',
                                          'CONFIGURING', None):
            return state
        if time.monotonic() > until:
            subprocess.run(['scancel', job], env=env)
            pytest.fail(f'job {job} still {state.get("JobState")} after '
                        f'{deadline_s} s and was cancelled')
        time.sleep(0.5)


def in_book_folder(tmp_path):
    """A folder laid out as the book's root, as the page's scripts expect."""
    (tmp_path / 'chapter_multi_gpu').symlink_to(ROOT / 'chapter_multi_gpu')
    return tmp_path


def submit(framework, slurm, folder, epochs=1, data=BRIEF_DATA):
    """Queue the tab's batch script as the page's one-machine command does, the job's environment updated with `data`; the job's number."""
    own, shared = tab_blocks(framework, 'bash')
    script, = [b for b in own if b.startswith('#!/bin/bash\n#SBATCH')]
    command, = [b for b in shared if b.startswith('sbatch ')]
    (folder / 'ddp.sbatch').write_text(brief(script, free_port(), epochs))
    # without --wait: the job's state is polled, as sbatch --wait polls
    # only every few seconds
    args = command.split()[:-1] + ['--time=5', 'ddp.sbatch']
    done = subprocess.run(args, cwd=folder, env=dict(slurm, **data),
                          capture_output=True, text=True, timeout=60)
    job = re.search(r'Submitted batch job (\d+)', done.stdout)
    assert job, done.stdout + done.stderr
    return job.group(1)


def finished(job, slurm, folder):
    """Wait for the job; its output, once it has ended with exit code 0."""
    state = wait_for_job(job, slurm, deadline_s=400)
    out = (folder / f'ddp-resnet18-{job}.out').read_text()
    assert (state['JobState'], state['ExitCode']) == ('COMPLETED', '0:0'), \
        f'{state}\n{out[-3000:]}'
    assert re.search(r'^2 processes, backend \w+, rank 0 on cpu', out, re.M), \
        out[-3000:]
    assert 'test accuracy' in out, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.slurm
def test_each_tab_s_batch_script_trains_as_a_two_task_job_on_one_machine(
        framework, slurm, tmp_path):
    folder = in_book_folder(tmp_path)
    finished(submit(framework, slurm, folder), slurm, folder)


def workers_in(folder):
    """The pids of the training processes (not launchers) running in `folder`."""
    pids = []
    for proc in pathlib.Path('/proc').glob('[0-9]*'):
        try:
            args = (proc / 'cmdline').read_bytes().split(b'\0')
            here = os.readlink(proc / 'cwd') == str(folder)
        except OSError:
            continue
        if here and any(a.endswith(b'ddp_train.py') for a in args) \
                and not any(b'torchrun' in a for a in args):
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
@pytest.mark.slurm
def test_with_max_restarts_a_killed_process_restarts_and_the_job_ends_well(
        framework, slurm, tmp_path):
    if framework != 'pytorch':
        pytest.skip('only the PyTorch script asks its launcher for restarts')
    folder = in_book_folder(tmp_path).resolve()
    # five epochs of quick mode's images, so that the kill lands in training
    # even on a busy machine
    job = submit(framework, slurm, folder, epochs=5, data={})
    out = folder / f'ddp-resnet18-{job}.out'
    until = time.monotonic() + 120  # until the first attempt reads its data
    while time.monotonic() < until and not (
            out.exists() and 'Fashion-MNIST files from' in out.read_text()):
        time.sleep(0.2)
    pids = workers_in(folder)
    assert len(pids) == 2, f'the job runs {len(pids)} processes, not 2'
    os.kill(max(pids), signal.SIGKILL)
    # an agent whose processes had ended would wait for no new attempt
    assert 'test accuracy' not in out.read_text(), \
        'the first attempt ended before the kill: give it more epochs'
    out = finished(job, slurm, folder)
    # each attempt's processes wait for each other once: two attempts
    assert len(re.findall(r'^rank 0 waits for all 2 ranks', out, re.M)) == 2, \
        out[-3000:]


@pytest.mark.parametrize('kind', ['Service', 'Job'])
def test_each_tab_s_manifest_is_valid_for_the_kubernetes_api(framework, kind):
    import kubernetes_validate
    import yaml
    own, shared = tab_blocks(framework, 'yaml')
    manifest, = [yaml.safe_load(b) for b in own + shared
                 if f'\nkind: {kind}\n' in b]
    kubernetes_validate.validate(manifest, '1.33', strict=True)
    assert manifest['metadata']['name'] == 'ddp'
    if kind == 'Job':  # two pods, numbered, named through the Service
        spec = manifest['spec']
        assert (spec['completionMode'], spec['completions'],
                spec['parallelism'], spec['backoffLimit']) == \
            ('Indexed', 2, 2, 0)
        assert spec['template']['spec']['subdomain'] == 'ddp'


@pytest.mark.slow
def test_the_two_pods_commands_train_together(framework, tmp_path):
    # run here as two processes, ddp-0.ddp standing for this machine
    import yaml
    own, _ = tab_blocks(framework, 'yaml')
    job, = [yaml.safe_load(b) for b in own if '\nkind: Job\n' in b]
    container, = job['spec']['template']['spec']['containers']
    port = free_port()
    folder = in_book_folder(tmp_path)
    pods = []
    for index in range(job['spec']['completions']):
        args = brief('\0'.join(container['command'] + container['args']),
                     port).replace('ddp-0.ddp', 'localhost').replace(
                         '$(JOB_COMPLETION_INDEX)', str(index)).split('\0')
        env = shell_env(JOB_COMPLETION_INDEX=str(index), **BRIEF_DATA)
        pods.append(subprocess.Popen(
            args, cwd=folder, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outs = []
    try:
        for pod in pods:
            outs.append(pod.communicate(timeout=300)[0])
    finally:
        for pod in pods:
            try:
                os.killpg(pod.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = '\n'.join(outs)
    assert [pod.returncode for pod in pods] == [0, 0], text[-3000:]
    assert re.search(r'^2 processes, backend \w+, rank 0 on cpu', text, re.M), \
        text[-3000:]
    assert 'test accuracy' in text, text[-3000:]
