"""Tests of scripts/gpu_run.py (`make gpu-run`): the PyTorch tab of a page run without Jupyter,
into notebooks of the stored format (the record in the notebook's metadata).

The run here is quick mode on the CPU; on a GPU machine the same script runs
full mode. Jupyter's packages are made unimportable, as on a reader's GPU
machine that has only PyTorch, NumPy and matplotlib.
"""
import json
import os
import subprocess
import sys

import nbformat

from conftest import ROOT

BLOCKED = ('IPython', 'ipykernel', 'jupyter_client', 'nbclient', 'nbformat',
           'notedown', 'd2lbook', 'matplotlib_inline')


def run_gpu_run(tmp_path, *args):
    stubs = tmp_path / 'no-jupyter'
    stubs.mkdir()
    for name in BLOCKED:
        (stubs / f'{name}.py').write_text(
            f'raise ImportError("{name} is not installed here")\n')
    env = dict(os.environ, PYTHONPATH=str(stubs))
    return subprocess.run(
        [sys.executable, str(ROOT / 'scripts' / 'gpu_run.py'), '--quick',
         '--out', str(tmp_path / 'out'), *args], capture_output=True,
        text=True, timeout=600, env=env)


def test_a_page_runs_without_jupyter_into_a_notebook_that_carries_its_record(tmp_path):
    page = 'chapter_multi_gpu/multiple-gpus.md'
    proc = run_gpu_run(tmp_path, '--pages', 'chapter_multi_gpu/helpers.md',
                       page)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / 'out'
    kinds = set()
    for name in ('helpers', 'multiple-gpus'):
        path = out / 'pytorch' / 'chapter_multi_gpu' / f'{name}.ipynb'
        nbformat.validate(nbformat.read(str(path), as_version=4))
        notebook = json.loads(path.read_text())
        kinds |= {o['output_type'] for c in notebook['cells']
                  for o in c['outputs']}
        record = notebook['metadata']['d2l_outputs']
        assert record['page'] == f'chapter_multi_gpu/{name}.md'
        assert record['mode'] == 'quick' and record['failed'] is None
        assert record['seconds'] > 0 and len(record['key']) == 64
        assert record['devices'] and record['date'] and record['torch_build']
        assert str(ROOT) not in path.read_text()
        # train() keeps its Animator to itself; its curve shows all the same.
        training = [c for c in notebook['cells']
                    if ''.join(c['source']).startswith('train(num_devices')]
        assert all(any(o['output_type'] == 'display_data' for o in c['outputs'])
                   for c in training), f'{name}: a training cell shows no curve'
        assert len(training) == (2 if name == 'multiple-gpus' else 0)
    assert {'stream', 'display_data', 'execute_result'} <= kinds
    summary = (out / 'summary.md').read_text().splitlines()
    assert summary[0].startswith('quick-mode run of 2 pages on ')
    rows = summary[4:]
    assert len(rows) == 2 and all(r.startswith(f'| {page} |') for r in rows)


def test_a_failing_cell_is_stored_with_its_error_and_named(tmp_path):
    book_page = ROOT / 'chapter_multi_gpu' / '_gpu_run_test_page.md'
    book_page.write_text('# Broken\n\n```{.python .input}\n#@tab all\n'
                         'print("before")\n1 / 0\n```\n\n'
                         '```{.python .input}\n#@tab all\nprint("never")\n'
                         '```\n')
    try:
        proc = run_gpu_run(tmp_path, '--pages',
                           'chapter_multi_gpu/_gpu_run_test_page.md')
    finally:
        book_page.unlink()
    assert proc.returncode == 1
    assert '_gpu_run_test_page.md: a cell failed' in proc.stderr
    notebook = json.loads((tmp_path / 'out' / 'pytorch' / 'chapter_multi_gpu' /
                           '_gpu_run_test_page.ipynb').read_text())
    assert len(notebook['cells']) == 1  # stopped at the error
    text = notebook['cells'][0]['outputs'][0]['text']
    assert 'before' in text and 'ZeroDivisionError' in text
    assert notebook['metadata']['d2l_outputs']['failed'] == \
        'ZeroDivisionError: division by zero'
    assert (tmp_path / 'out' / 'summary.md').read_text().endswith(
        'failed:\n* chapter_multi_gpu/_gpu_run_test_page.md: a cell failed\n')


def test_an_unknown_page_is_refused_with_an_example(tmp_path):
    proc = run_gpu_run(tmp_path, '--pages', 'chapter_multi_gpu/nope.md')
    assert proc.returncode == 2
    assert 'no page chapter_multi_gpu/nope.md' in proc.stderr
    assert 'chapter_multi_gpu/helpers.md' in proc.stderr
