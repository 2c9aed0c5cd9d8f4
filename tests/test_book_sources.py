"""The book's markdown pages, read as d2lbook reads them: checks that need no build.

* Every heading belongs to every tab. A heading inside a `:begin_tab:` block
  makes d2lbook start a new section inside one framework's text, and the
  rendered page loses its tab bar, its table of contents and its footer's
  place from there on (tests/test_rendered_book.py checks the result).
* The prose reads as a finished book: it describes what the page's stored
  outputs show, not runs, build targets or debugging sessions that are not
  on the page.
"""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted(ROOT.glob('chapter_*/*.md'))
HEADING = re.compile(r'#{1,6}\s')


def prose_lines(text):
    """(line number, line) of every line outside the code cells of TEXT."""
    in_code = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith('```'):
            in_code = not in_code
            continue
        if not in_code:
            yield number, line


def tab_block_problems(text):
    """Lines where a tab-only prose block holds what belongs to every tab, or never ends."""
    problems, opened, in_code = [], None, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith('```'):  # a code cell, or a shell listing in the prose
            if opened and not in_code and line.startswith('```{.python .input}'):
                problems.append(f'line {number}: code cell inside the tab block of line '
                                f'{opened}; end the block first')
            in_code = not in_code
        elif in_code:
            continue
        elif line.startswith(':begin_tab:'):
            if opened:
                problems.append(f'line {number}: :begin_tab: inside the block of line {opened}')
            opened = number
        elif line.startswith(':end_tab:'):
            if not opened:
                problems.append(f'line {number}: :end_tab: without :begin_tab:')
            opened = None
        elif opened and HEADING.match(line):
            problems.append(f'line {number}: heading {line!r} inside the tab block of '
                            f'line {opened}; put it above the block')
    if opened:
        problems.append(f'line {opened}: :begin_tab: never ends')
    return problems


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_headings_and_code_cells_stay_outside_tab_only_prose(page):
    assert tab_block_problems(page.read_text()) == []


def test_a_heading_in_a_tab_block_is_found():
    text = ('## Training\n\n:begin_tab:`paddle`\n### One Process per Device\n\nText.\n'
            ':end_tab:\n\n```{.python .input}\n#@tab paddle\nx = 1\n```\n')
    assert tab_block_problems(text) == [
        "line 4: heading '### One Process per Device' inside the tab block of line 3; "
        "put it above the block"]
    assert tab_block_problems(text.replace(':end_tab:\n', '')) == [
        "line 4: heading '### One Process per Device' inside the tab block of line 3; "
        "put it above the block",
        'line 8: code cell inside the tab block of line 3; end the block first',
        'line 3: :begin_tab: never ends']
    fixed = text.replace(':begin_tab:`paddle`\n### One Process per Device\n',
                         '### One Process per Device\n\n:begin_tab:`paddle`\n')
    assert tab_block_problems(fixed) == []


# Lab-notebook prose: what a page must not say, and why.
LAB_NOTEBOOK = {
    'names a build target': re.compile(
        r'`make [\w-]+[^`]*`|\bmake (?:bench|html|pdf|lib|eval|publish|outputs-status'
        r'|test-[\w-]+)\b'),
    'reports a run that is not on the page': re.compile(
        r'\bnot stored\b|\bnot measured (?:here|for this book)\b|\bin our runs\b'
        r'|\bended at (?:a test accuracy of )?\d|\brun of this page\b'),
    'names a debugging flag': re.compile(
        r'\b[A-Z][A-Z0-9]*_(?:VERBOSE|DEBUG)\b|\bGLOG_v\b'),
    'reports a measurement of the writer\'s machine': re.compile(
        r'\d\s*(?:us|ms|s|seconds|minutes)\s+here\b|\bour (?:[\w-]+ )?machine\b'),
}


def lab_notebook_passages(text):
    """(what is wrong, passage) for each lab-notebook passage in TEXT's prose."""
    prose = ' '.join(line for _, line in prose_lines(text))  # a phrase may wrap
    found = []
    for what, pattern in LAB_NOTEBOOK.items():
        for match in pattern.finditer(prose):
            found.append((what, prose[max(0, match.start() - 40):match.end() + 20]))
    return found


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_prose_describes_the_page_not_the_writers_lab_notebook(page):
    assert lab_notebook_passages(page.read_text()) == []


@pytest.mark.parametrize('passage', [
    'and MXNet (0.6 to 0.85 times in MXNet, by `make\nbench`): one process',
    'the same run ended at a test accuracy of 0.565\n(not stored): the last steps',
    'oneDNN kernel (`DNNL_VERBOSE=1` lists none, whatever the flags)',
    'forward and backward on two threads, took\n380-450 ms here against PyTorch',
    'slower than PyTorch\'s on our two-core machine.',
    'made this network unstable in our\nruns',
    'A one-device\nPyTorch run of this page with a constant rate of 0.1',
    'per class, ended at 0.64 although its training loss had kept falling',
    'its advantage should grow with the GPU count\n(not measured here).',
])
def test_lab_notebook_passages_are_found(passage):
    assert len(lab_notebook_passages('Some prose.\n' + passage + '\n')) >= 1


def test_code_and_plain_words_are_not_lab_notebook():
    text = ('Processes on this machine listen on the loopback interface. We make\n'
            'the batch bigger; results here agree with :numref:`sec_x`.\n\n'
            '```{.python .input}\nos.environ["NCCL_DEBUG"] = "INFO"  # make bench\n```\n')
    assert lab_notebook_passages(text) == []


def test_every_visible_code_line_and_cell_fits_its_box():
    """No shown code line over 79 characters, no shown cell over 30 lines."""
    import runpy
    fit = runpy.run_path(str(ROOT / 'scripts' / 'code_fit.py'))
    assert list(fit['problems']()) == []


def test_a_line_or_cell_too_long_is_found(tmp_path):
    import runpy
    fit = runpy.run_path(str(ROOT / 'scripts' / 'code_fit.py'))
    (tmp_path / 'chapter_multi_gpu').mkdir()
    (tmp_path / 'chapter_appendix').mkdir()
    (tmp_path / 'chapter_appendix' / 'd2l-package.md').write_text('')
    (tmp_path / 'chapter_multi_gpu' / 'page.md').write_text(
        '```{.python .input}\n#@tab all\n#@save\n' + 'x = 1\n' * 31 +
        '```\n\n```{.python .input}\ny = "' + 'a' * 80 + '"\n```\n'
        '\n```{.python .input}\n#@hide\nz = "' + 'b' * 80 + '"\n```\n')
    fit['problems'].__globals__['ROOT'] = tmp_path
    assert list(fit['problems']()) == [
        'chapter_multi_gpu/page.md:1: cell of 31 lines',
        'chapter_multi_gpu/page.md:38: line of 86 characters']  # not hidden


def labels_taken_as_table_captions(text):
    """Lines of `:label:` marks that pandoc would read as the next table's caption."""
    lines = list(prose_lines(text))
    found = []
    for i, (number, line) in enumerate(lines):
        if not line.startswith(':label:'):
            continue
        rest = [l for _, l in lines[i + 1:i + 4] if l.strip()]
        if rest and rest[0].lstrip().startswith('|'):
            found.append(number)
    return found


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_label_names_its_figure_not_the_next_table(page):
    """A `: text` line before a table is pandoc's table caption: the label is lost."""
    assert labels_taken_as_table_captions(page.read_text()) == []


def test_a_label_above_a_table_is_found():
    text = ('![A figure](../img/x.svg)\n:label:`fig_x`\n\n| a | b |\n|:--|:--|\n'
            '| 1 | 2 |\n\n![Another](../img/y.svg)\n:label:`fig_y`\n\nText.\n')
    assert labels_taken_as_table_captions(text) == [2]


# Every page source at most MAX_PAGE_LINES lines. Every page fits today, so
# STILL_LONG is empty; a page listed there may only shrink, never grow past
# its count, and leaves the list once it fits.
MAX_PAGE_LINES = 800
STILL_LONG = {}


def length_problems(pages, limit=MAX_PAGE_LINES, still_long=STILL_LONG):
    """A sentence for each page of PAGES ({name: text}) longer than allowed."""
    problems = []
    for name, text in sorted(pages.items()):
        lines = len(text.splitlines())
        allowed = still_long.get(name, limit)
        if lines > allowed:
            problems.append(f'{name} has {lines} lines, more than {allowed}: '
                            f'shorten it or move machinery to an appendix')
        elif name in still_long and lines <= limit:
            problems.append(f'{name} has {lines} lines and fits: remove it '
                            f'from STILL_LONG')
    return problems


def test_every_page_source_has_at_most_800_lines():
    pages = {p.relative_to(ROOT).as_posix(): p.read_text() for p in PAGES}
    assert set(STILL_LONG) <= set(pages), 'STILL_LONG names a missing page'
    assert length_problems(pages) == []


def test_an_over_long_page_is_found():
    fits, long = 'x\n' * MAX_PAGE_LINES, 'x\n' * (MAX_PAGE_LINES + 1)
    assert length_problems({'a.md': fits}) == []
    assert length_problems({'a.md': long}) == [
        'a.md has 801 lines, more than 800: shorten it or move machinery to '
        'an appendix']
    # A listed page may keep its count but not grow, and leaves once it fits.
    assert length_problems({'a.md': long + 'x\n'}, still_long={'a.md': 802}) == []
    assert length_problems({'a.md': long + 'x\n' * 2},
                           still_long={'a.md': 802}) == [
        'a.md has 803 lines, more than 802: shorten it or move machinery to '
        'an appendix']
    assert length_problems({'a.md': fits}, still_long={'a.md': 802}) == [
        'a.md has 800 lines and fits: remove it from STILL_LONG']
