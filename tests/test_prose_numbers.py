"""Every number a page's prose states holds in the tab that shows it.

The prose of a tab is the page's shared prose plus that tab's
`:begin_tab:` blocks. Each number in it must appear, up to the rounding of
its printed digits, in that tab's stored outputs
(`outputs/<tab>/<page>.ipynb`) or in that tab's code cells. A number that
only one tab's outputs show belongs in that tab's block, not in the shared
prose. No notebook runs and nothing is built: the check reads text.

What counts as a number, and what it may match:

* Digits standing alone: `0.857`, `60,000`, `29%`, `11.2 million` (that
  is, 11,200,000 to the printed digits), and a number in math
  that is nothing but a number (`$2\\cdot10^{-8}$`). Digits glued to a name
  (`ResNet-18`, `fp16`, `1F1B`, `x16`, `8-bit`), version numbers after a
  product name (`Python 3.9`, `PCIe 4.0`) and years (1950 to 2030) are
  names, not claims.
* Left out: code cells and inline code, math that is a formula (it has a
  symbol or an operator), references and citations (`:numref:`, `:cite:`,
  labels), link and image addresses, and the Exercises section, whose
  numbers are settings of runs the reader is asked to make.
* A prose number with d decimals matches a value that rounds to it at d
  decimals (0.857 matches 0.8567; 9.5 matches 9.47); `2\\cdot10^{-8}`
  matches whatever rounds to it at one significant digit.
* Values: every number in the tab's outputs (text, not SVG) and in its
  code cells (the mantissa of `44.7e6` too), and, for the numbers printed
  on one line of output, their sums, differences and ratios (a total, a
  gap between two columns, a speedup). A percentage also matches 100 times a value or a
  relative difference of two numbers on one line.
* `EXCEPTIONS` lists the few numbers whose source is neither, each with the
  reason; `AWAITING_RERUN` the numbers of pages whose stored outputs are
  stale, which their next `make publish` must bring about.
"""
import bisect
import json
import math
import pathlib
import re

import pytest

from conftest import ROOT, tab_cells

TABS = ('pytorch', 'mxnet', 'paddle')
PAGES = sorted(p for p in ROOT.glob('chapter_*/*.md')
               if (ROOT / 'outputs' / 'pytorch' / p.relative_to(ROOT)
                   .with_suffix('.ipynb')).exists())

# Pages about the d2l package's own machinery state its constants (deadlines,
# subset sizes): for them, the package's hand-written runtime and the
# launcher scripts are code too.
LAUNCHERS = ['chapter_multi_gpu/ddp_train.py',
             'chapter_multi_gpu/ddp_train_mxnet.py',
             'chapter_multi_gpu/ddp_train_paddle.py']
SOURCES = {
    'chapter_appendix/machinery.md': ['d2l/runtime.py'] + LAUNCHERS,
    'chapter_multi_gpu/process-groups.md': ['d2l/runtime.py'] + LAUNCHERS,
}

# (page, tab or '*', number as written): why neither the outputs nor the
# code of that tab hold it. Keep this list short.
EXCEPTIONS = {
    ('chapter_multi_gpu/process-groups.md', 'pytorch', '15'):
        'the last global rank of two machines of eight processes each',
    ('chapter_multi_gpu/distributed-data-parallel.md', 'paddle', '30'):
        "PaddlePaddle's Gloo timeout, fixed inside the framework",
    ('chapter_multi_gpu/process-groups.md', 'paddle', '30'):
        "PaddlePaddle's Gloo timeout, fixed inside the framework",
    ('chapter_multi_gpu/helpers.md', '*', '9'):
        "Fashion-MNIST's ten labels, 0 to 9",
    ('chapter_multi_gpu/mixed-precision.md', '*', '65504'):
        "fp16's largest finite number, a property of the format",
    ('chapter_multi_gpu/sharded-data-parallel.md', '*', '61,706'):
        "LeNet's parameter count; the outputs print its 247 KB",
    ('chapter_multi_gpu/multiple-gpus-concise.md', '*', '62'):
        "LeNet's parameter count, printed by the from-scratch section",
    ('chapter_multi_gpu/multiple-gpus-concise.md', '*', '41'):
        "ResNet-18's multiply-adds per parameter, counted from its layers",
    ('chapter_multi_gpu/multiple-gpus-concise.md', '*', '7'):
        "LeNet's multiply-adds per parameter, counted from its layers",
    ('chapter_multi_gpu/overlap.md', '*', '25'):
        "PyTorch DDP's default bucket cap in MB, from the cited paper",
    ('chapter_multi_gpu/ddp-resnet18.md', '*', '90'):
        "Goyal et al.'s training run, from the cited paper",
    ('chapter_multi_gpu/ddp-resnet18.md', '*', '1.28'):
        "ImageNet's training images in Goyal et al.'s run, from the paper",
    ('chapter_multi_gpu/sharded-data-parallel.md', '*', '14'):
        'the printed 112 GB of a 7B model spread over eight devices',
    ('chapter_multi_gpu/checkpoints.md', '*', '16,384'):
        "Llama 3's largest cluster, from the cited paper",
    ('chapter_multi_gpu/checkpoints.md', '*', '419'):
        "Llama 3's unexpected interruptions, from the cited paper",
    ('chapter_multi_gpu/checkpoints.md', '*', '54'):
        "the days in which Llama 3 counted them, from the cited paper",
    ('chapter_multi_gpu/checkpoints.md', 'pytorch', '135712'):
        "the number of PyTorch's issue on restarts with a shared store",
}

# (page, tab or '*', number as written): numbers that the next full-mode
# run of a stale page (make publish PAGES=<page>) is expected to print.
AWAITING_RERUN = {}

NUMBER = re.compile(
    r'(?<![\w.])(?<![A-Za-z0-9]-)(?<![/\\^{])'
    r'(?P<num>\d{1,3}(?:,\d{3})+|\d+)(?P<dec>\.\d+)?'
    r'(?P<pct>\s?%)?(?P<scale>\s(?:thousand|million|billion)\b)?'
    r'(?![\w/]|\.\d|-[A-Za-z])')
SCALE = {' thousand': 1e3, ' million': 1e6, ' billion': 1e9}
VALUE = re.compile(r'\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')
ROLE = re.compile(r':\w+:`[^`]*`')
INLINE_CODE = re.compile(r'`[^`]*`')
LINK_TARGET = re.compile(r'\]\([^)]*\)')
MATH = re.compile(r'\$\$(.+?)\$\$|\$(.+?)\$', re.S)
SCIENTIFIC = re.compile(r'^(\d+(?:\.\d+)?)\\cdot\s*10\^\{?(-?\d+)\}?$')
VERSION = re.compile(r'\b(?:Python|PCIe|CUDA|NumPy|MXNet|PyTorch|'
                     r'PaddlePaddle|version|versions)\s+$')


def tab_prose(text, tab):
    """The prose that `tab` shows of a page's markdown TEXT, as one string."""
    lines, block_tabs, fence, exercises = [], None, False, False
    for line in text.splitlines():
        if line.startswith('```'):
            fence = not fence
            continue
        if fence:
            continue
        if line.startswith(':begin_tab:'):
            block_tabs = {t.strip() for t in
                          line.split('`')[1].split(',')}
            continue
        if line.startswith(':end_tab:'):
            block_tabs = None
            continue
        if re.match(r'#{1,6}\s', line):
            exercises = line.strip('# ').strip() == 'Exercises'
        if exercises:
            continue
        if block_tabs is None or tab in block_tabs:
            lines.append(line)
    return '\n'.join(lines)


def _clean(prose):
    """PROSE without references, inline code and link addresses."""
    prose = ROLE.sub(' ', prose)
    prose = INLINE_CODE.sub(' ', prose)
    return LINK_TARGET.sub(']', prose)


def prose_numbers(prose):
    """(number as written, value, tolerance, is a percentage, context)."""
    found = []

    def math(match):
        body = (match.group(1) or match.group(2)).strip()
        sci = SCIENTIFIC.match(body.replace(' ', ''))
        if sci:
            mantissa, exponent = sci.groups()
            digits = len(mantissa.split('.')[1]) if '.' in mantissa else 0
            value = float(mantissa) * 10 ** int(exponent)
            found.append((body, value,
                          0.5 * 10 ** (int(exponent) - digits), False, body))
        elif re.fullmatch(r'\d+(?:\.\d+)?', body):
            return f' {body} '
        return ' '
    text = MATH.sub(math, _clean(prose))
    for match in NUMBER.finditer(text):
        written = match.group('num') + (match.group('dec') or '')
        if VERSION.search(text[max(0, match.start() - 15):match.start()]):
            continue
        value = float(written.replace(',', ''))
        if not match.group('dec') and 1950 <= value <= 2030 \
                and ',' not in written:
            continue  # a year
        digits = len(match.group('dec') or '.') - 1
        scale = SCALE.get(match.group('scale') or '', 1)
        context = ' '.join(
            text[max(0, match.start() - 50):match.end() + 30].split())
        found.append((written + ('%' if match.group('pct') else ''),
                      value * scale, 0.5 * 10 ** -digits * scale,
                      bool(match.group('pct')), context))
    return found


def _numbers(text):
    """The values of the numbers in TEXT, and the mantissas of 1.5e6."""
    values = []
    for token in VALUE.findall(text):
        values.append(float(token))
        if 'e' in token.lower():
            values.append(float(re.split('[eE]', token)[0]))
    return values


def output_texts(page, tab):
    """The text outputs of the stored notebook of PAGE's TAB, cell by cell."""
    path = ROOT / 'outputs' / tab / page.relative_to(ROOT).with_suffix(
        '.ipynb')
    texts = []
    for cell in json.loads(path.read_text())['cells']:
        for out in cell.get('outputs', []):
            text = out.get('text') or out.get('data', {}).get('text/plain')
            if out.get('output_type') == 'error':
                text = out.get('evalue', '')
            if text:
                texts.append(''.join(text))
    return texts


def candidate_values(outputs, code):
    """Sorted values a prose number may match, and percentages apart."""
    values, percents = [], []
    for text in outputs:
        for line in text.splitlines():
            row = _numbers(line)
            values += row
            if len(row) > 16:
                continue  # a long row: a list of numbers, not columns
            for i, a in enumerate(row):
                for b in row[i + 1:]:
                    values += [abs(a - b), a + b]
                    if a and b:
                        values += [a / b, b / a]
                        percents += [100 * abs(a / b - 1),
                                     100 * abs(b / a - 1)]
    values += _numbers('\n'.join(code))
    percents += [100 * v for v in values]
    return sorted(values), sorted(percents + values)


def _holds(value, tolerance, candidates):
    low = bisect.bisect_left(candidates, value - tolerance * (1 + 1e-9))
    return low < len(candidates) and \
        candidates[low] <= value + tolerance * (1 + 1e-9)


def unmatched_numbers(text, outputs, code, tab):
    """The numbers of TAB's prose in TEXT found in neither OUTPUTS nor CODE."""
    values, percents = candidate_values(outputs, code)
    missing = []
    for written, value, tolerance, percent, context in prose_numbers(
            tab_prose(text, tab)):
        if not _holds(value, tolerance, percents if percent else values):
            missing.append((written, context))
    return missing


def _listed(table, name, tab, written):
    return (name, tab, written) in table or (name, '*', written) in table


@pytest.mark.parametrize('tab', TABS)
@pytest.mark.parametrize('page', PAGES,
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_number_in_a_tabs_prose_appears_in_that_tabs_outputs_or_code(
        page, tab):
    name = page.relative_to(ROOT).as_posix()
    code = tab_cells(page, tab) + [(ROOT / source).read_text()
                                   for source in SOURCES.get(name, [])]
    missing = [(w, c) for w, c in unmatched_numbers(
        page.read_text(), output_texts(page, tab), code, tab)
        if not _listed(EXCEPTIONS, name, tab, w)
        and not _listed(AWAITING_RERUN, name, tab, w)]
    assert missing == [], (
        f'{name} [{tab}]: numbers that this tab neither prints nor sets in '
        f'its code; correct them, or move them into a :begin_tab: block of '
        f'the tabs they hold for')


def test_every_exception_names_a_number_still_in_the_prose():
    for table in (EXCEPTIONS, AWAITING_RERUN):
        for name, tab, written in table:
            text = (ROOT / name).read_text()
            tabs = TABS if tab == '*' else (tab,)
            assert any(written in [n[0] for n in prose_numbers(
                tab_prose(text, t))] for t in tabs), (name, tab, written)


PIPELINE_BEFORE = """\
With one micro-batch each stage idles half the time (0.50 to 0.51 in every
tab). Up to four micro-batches the measurements lie within 0.09 of the
formula. With eight micro-batches they lie at 0.15 to 0.22, all above the
formula's 0.11. The gradients agree within $2\\cdot10^{-8}$.
"""
PIPELINE_OUTPUTS = {
    'pytorch': ['gpipe 1 0.505 0.500\ngpipe 4 0.290 0.200\n'
                'gpipe 8 0.152 0.111\n1f1b 8 0.224 0.111\n'
                'largest gradient difference 1.6e-08\n'],
    'mxnet': ['gpipe 1 0.500 0.500\ngpipe 4 0.231 0.200\n'
              'gpipe 8 0.157 0.111\n1f1b 8 0.224 0.111\n'
              'largest gradient difference 3.7e-09\n'],
}


def test_a_number_that_only_one_tab_prints_is_found_in_the_others():
    code = ['for m in (1, 2, 4, 8):\n    pass']
    assert unmatched_numbers(PIPELINE_BEFORE, PIPELINE_OUTPUTS['pytorch'],
                             code, 'pytorch') == []
    missing = [w for w, _ in unmatched_numbers(
        PIPELINE_BEFORE, PIPELINE_OUTPUTS['mxnet'], code, 'mxnet')]
    assert missing == ['2\\cdot10^{-8}', '0.51', '0.09', '0.15']


def test_a_tab_block_is_read_only_in_its_tabs():
    text = ('Shared 0.25.\n\n:begin_tab:`mxnet`\nOnly 0.75.\n:end_tab:\n\n'
            '```{.python .input}\nx = 0.5\n```\n\n## Exercises\n\n1. Try 9.\n')
    assert [n[0] for n in prose_numbers(tab_prose(text, 'pytorch'))] == [
        '0.25']
    assert [n[0] for n in prose_numbers(tab_prose(text, 'mxnet'))] == [
        '0.25', '0.75']


@pytest.mark.parametrize('written, value', [
    ('0.857', 0.8567), ('9.5', 9.47), ('60,000', 60000), ('29%', 29.4),
    ('29%', 0.29)])
def test_a_number_matches_a_value_that_rounds_to_it(written, value):
    assert unmatched_numbers(f'It is {written} here.', [f'{value}'], [],
                             'pytorch') == []


@pytest.mark.parametrize('phrase', [
    'ResNet-18 in fp16', 'a 1F1B schedule', 'PCIe 4.0 x16', 'Python 3.9',
    'Goyal et al. (2017)', ':numref:`sec_x` and `batch=512`',
    'the formula $m + p - 1$', '![A 3-stage run](../img/x2.svg)'])
def test_names_references_code_and_formulas_are_not_numbers(phrase):
    assert prose_numbers(phrase) == []


def test_a_stated_percentage_may_be_a_gap_between_two_printed_numbers():
    assert unmatched_numbers('42% too slow.', ['0.1420 0.1000'], [],
                             'pytorch') == []
    assert unmatched_numbers('40% too slow.', ['0.1420 0.1000'], [],
                             'pytorch') == [('40%', '40% too slow.')]
