"""Shared fixtures: every test that takes `d2l` runs once per framework."""
import importlib
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FRAMEWORKS = ('pytorch', 'mxnet', 'paddle')
MODULES = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    """The name of the framework (tab) under test."""
    return request.param


@pytest.fixture
def d2l(framework):
    """The generated d2l module of the framework under test."""
    return importlib.import_module(f'd2l.{MODULES[framework]}')


@pytest.fixture
def quick(monkeypatch):
    """Force quick mode, whatever hardware the tests run on."""
    monkeypatch.setenv('D2L_QUICK', '1')
