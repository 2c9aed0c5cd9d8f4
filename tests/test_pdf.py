"""The PDF book: every chapter and section, its code, figures, equations and
bibliography, read back from the PDF with poppler's pdftotext.

The PDF comes from BOOK_PDF (default: _build/pdf/<name>.pdf, the output of
`make pdf`). The MXNet and PaddlePaddle PDFs next to it are checked when they
were built (scripts/build-pdf.sh builds all three unless PDF_TABS says
otherwise). Like the browser tests, everything is derived from the markdown
sources, so new sections are covered without editing this file.
"""
import configparser
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import tab_cells

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = configparser.ConfigParser()
CONFIG.read(ROOT / 'config.ini')
NAME = CONFIG['project']['name']
TABS = [t.strip() for t in CONFIG['build']['tabs'].split(',')]
PDF = pathlib.Path(os.environ.get('BOOK_PDF', ROOT / '_build' / 'pdf' / f'{NAME}.pdf'))
CODE_FENCE = re.compile(r'^```.*?^```', re.M | re.S)

pytestmark = pytest.mark.pdf


def sources():
    """The markdown sources of the chapters' pages, in file order."""
    return [p for p in sorted(ROOT.glob('chapter_*/*.md')) if 'references' not in p.parent.name]


def squash(text):
    """Whitespace collapsed and typographic quotes made plain, as LaTeX sets them."""
    text = text.replace('\u2019', "'").replace('\u2018', "'")
    return re.sub(r'\s+', ' ', text).strip()


def headings(md):
    """The page's # and ## headings as plain text (those with math or roles are skipped)."""
    found = []
    for line in CODE_FENCE.sub('', md).splitlines():
        match = re.match(r'^#{1,2} (.+)$', line)
        if match and '$' not in match[1] and not re.search(r':\w+:`', match[1]):
            # emphasis marks go; an underscore inside a name (spawn_ranks) stays
            plain = re.sub(r'[`*]|(?<!\w)_|_(?!\w)', '', match[1])
            found.append(plain.strip())
    return found


def code_lines(md, tab):
    """The stripped code lines of every cell the tab shows, in order."""
    return [line.strip() for cell in tab_cells(md, tab, default_tab=TABS[0])
            for line in cell.splitlines() if line.strip()]


def first_code_line(md, tab):
    """The first line of code only this tab shows (20 to 60 characters), or None.

    A line that no other tab has tells this tab's PDF apart from the others."""
    others = {line for other in TABS if other != tab for line in code_lines(md, other)}
    for line in code_lines(md, tab):
        if not line.startswith('#') and line not in others and 20 <= len(line) <= 60:
            return line
    return None


def pdf_text(path):
    if not path.exists():
        pytest.fail(f'No PDF at {path} (BOOK_PDF). Build it with `make pdf` '
                    '(or scripts/build-pdf.sh BOOK_ROOT).')
    if not shutil.which('pdftotext'):
        pytest.fail('pdftotext is missing: run `WITH_PDF=1 scripts/setup.sh` (poppler-utils)')
    return subprocess.run(['pdftotext', str(path), '-'], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope='module')
def text():
    return pdf_text(PDF)


def test_pdf_has_a_title_page_contents_and_a_page_per_section(text):
    info = subprocess.run(['pdfinfo', str(PDF)], check=True, capture_output=True,
                          text=True).stdout
    pages = int(re.search(r'^Pages:\s+(\d+)', info, re.M)[1])
    assert pages >= 2 + len(sources()), f'{PDF.name} has only {pages} pages'
    title = CONFIG['project']['title'].split(':')[0]
    assert title in squash(text[:2000]), 'the title page does not show the book title'
    assert 'Contents' in text


def test_pdf_has_every_chapter_and_section_heading(text):
    flat = squash(text)
    missing = [f'{md.relative_to(ROOT)}: {h}' for md in sources() for h in headings(md.read_text())
               if squash(h) not in flat]
    assert missing == [], 'headings missing from the PDF'


def test_pdf_shows_the_code_of_every_section(text):
    flat = squash(text)
    checked, missing = 0, []
    for md in sources():
        line = first_code_line(md, TABS[0])
        if line is None:
            continue
        checked += 1
        if squash(line) not in flat:
            missing.append(f'{md.relative_to(ROOT)}: {line}')
    assert checked > 0, 'no section has code for the first tab'
    assert missing == [], 'code lines missing from the PDF'


def test_pdf_has_every_figure_with_its_caption(text):
    figures = sum(len(re.findall(r'^!\[', CODE_FENCE.sub('', md.read_text()), re.M))
                  for md in sources())
    captions = set(re.findall(r'Fig\. (\d+(?:\.\d+)+):', text))
    assert len(captions) >= figures, (
        f'the sources have {figures} figures, the PDF {len(captions)} numbered captions')


def test_pdf_has_every_display_equation_numbered(text):
    # Sphinx numbers every display equation (math_number_all); the number is
    # printed beside it, and cross-references repeat it.
    displays = sum(CODE_FENCE.sub('', md.read_text()).count('$$') // 2 for md in sources())
    numbers = set(re.findall(r'\((\d+(?:\.\d+){2,})\)', text))
    assert len(numbers) >= displays, (
        f'the sources have {displays} display equations, the PDF {len(numbers)} equation numbers')
    tex = PDF.with_suffix('.tex')
    if displays and tex.exists():
        assert '\\begin{equation' in tex.read_text(), 'no equation environment in the LaTeX'


def test_pdf_bibliography_lists_every_cited_work(text):
    assert 'Bibliography' in text, 'the PDF has no bibliography'
    # The bibliography's heading follows the last section's exercises; later
    # occurrences of the word are its pages' running heads.
    bibliography = squash(text[text.index('Bibliography', text.rindex('Exercises')):])
    bib = (ROOT / 'references.bib').read_text()
    first_authors = {}
    for key, body in re.findall(r'@\w+\{([^,\s]+),(.*?)\n\}', bib, re.S):
        author = re.search(r'author\s*=\s*\{(.+?)\},?\s*$', body, re.M)
        if author:
            first_authors[key] = author[1].split(' and ')[0].split(',')[0].strip('{} ')
    cited = {key.strip() for md in sources()
             for keys in re.findall(r':cite[pt]?:`([^`]+)`', md.read_text())
             for key in keys.split(',')}
    assert cited, 'no :cite: in the sources'
    unknown = sorted(cited - set(first_authors))
    assert unknown == [], 'cited keys missing from references.bib'
    missing = sorted(k for k in cited if '\\' not in first_authors[k]
                     and first_authors[k] not in bibliography)
    assert missing == [], 'cited works missing from the PDF bibliography'


@pytest.mark.parametrize('tab', TABS[1:])
def test_each_frameworks_pdf_shows_its_own_code(tab):
    path = PDF.parent.parent / f'pdf_{tab}' / f'{NAME}-{tab}.pdf'
    if not path.exists():
        pytest.skip(f'the {tab} PDF was not built (PDF_TABS)')
    flat = squash(pdf_text(path))
    lines = [first_code_line(md, tab) for md in sources()]
    lines = [line for line in lines if line]
    assert lines, f'no section has {tab} code'
    missing = [line for line in lines if squash(line) not in flat]
    assert missing == [], f'{tab} code missing from {path.name}'
