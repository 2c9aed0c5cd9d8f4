"""The claims of chapter_multi_gpu/vit-mesh.md, checked in every framework.

The mesh's four ranks start with the book's spawn_ranks in a child Python
under a hard deadline (the harness of test_process_groups.py), so a hang
fails the test.
"""

import numpy as np
import pytest

from conftest import ROOT, numpy, page_definitions
from test_tensor_parallelism import RENDEZVOUS, child_result

PAGE = ROOT / 'chapter_multi_gpu' / 'vit-mesh.md'
MODEL = ('def patches', 'optimizer =')  # the ViT, and the page's setup


def test_the_vit_reads_an_image_as_its_patches_row_by_row(d2l, framework):
    page = page_definitions(PAGE, framework, ('def patches',))
    X = np.arange(2 * 28 * 28, dtype='float32').reshape(2, 1, 28, 28)
    tokens = numpy(framework, page['patches'](d2l.tensor(X), 7))
    assert tokens.shape == (2, 16, 49)
    for i in range(4):
        for j in range(4):
            tile = X[:, 0, 7 * i:7 * (i + 1), 7 * j:7 * (j + 1)]
            np.testing.assert_array_equal(tokens[:, 4 * i + j],
                                          tile.reshape(2, 49))


def test_the_vit_as_the_page_builds_it_fits_a_minibatch(d2l, framework, quick):
    page = page_definitions(PAGE, framework, MODEL)
    X, y = next(iter(d2l.load_data_fashion_mnist(64)[0]))
    losses = [float(d2l.train_step_concise(
        page['net'], X, y, page['loss'], page['optimizer'], [page['device']]))
        for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.slow
def test_the_2x2_mesh_takes_the_one_device_step(framework):
    """Two steps on the quick subset (one minibatch of 100 images each):
    every rank's test accuracy is one device's; the bytes on each axis are
    the formula's."""
    result = child_result(framework, f'''
        ranks = d2l.spawn_ranks(page['vit_mesh_worker'], 4,
                                {RENDEZVOUS[framework]}, 2)
        train_iter, test_iter = d2l.load_data_fashion_mnist(128)
        for epoch in range(2):
            d2l.train_epoch_concise(page['net'], train_iter, page['loss'],
                                    page['optimizer'], [page['device']])
        one = d2l.evaluate_accuracy_gpu(page['net'], test_iter)
        out = dict(ranks=ranks, one=one)
        ''', 300, PAGE, MODEL + ('def vit_mesh_worker',))
    b, s, h = 50, 16, 64  # half of the quick subset's one minibatch
    slots = 2 if framework == 'mxnet' else 1  # MXNet: both pairs' slots
    for r in result['ranks']:
        assert r['accuracy'] == result['one']
        assert r['b'] == b
        for direction in ('forward', 'backward'):
            assert r['tensor'][direction] == slots * 2 * 2 * 4 * b * s * h
        assert sum(r['data'].values()) == slots * 4 * r['params']
