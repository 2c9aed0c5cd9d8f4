"""The HTML book as a reader meets it: every page opened from disk in headless
Chromium, with the network cut off.

The pages come from BOOK_HTML_DIR (default: _build/html, the output of
`make html`); screenshots go to _build/screenshots/. The browser is Debian's
`chromium` (WITH_BROWSER=1 scripts/setup.sh installs it), driven by Playwright;
CHROMIUM names another binary. Pages are derived from the book's markdown
sources, so a section added to a chapter (chapter_multi_gpu/, the appendix in
chapter_appendix/) is covered without editing this file.
"""
import functools
import html as html_lib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import tempfile
import zipfile
from html.parser import HTMLParser
from urllib.parse import unquote, urlparse

import pytest

from conftest import CELL

ROOT = pathlib.Path(__file__).resolve().parent.parent
HTML_DIR = pathlib.Path(os.environ.get('BOOK_HTML_DIR', ROOT / '_build' / 'html')).resolve()
SCREENSHOTS = ROOT / '_build' / 'screenshots'
CHROMIUM = os.environ.get('CHROMIUM', '/usr/bin/chromium')
# Chapters whose pages hold no code in three frameworks.
NO_CODE_CHAPTERS = ('chapter_references',)
# Sections whose code is job scripts shown as text, in three tabs, with no
# Python cell and so no outputs; tests/test_cluster.py runs those scripts.
TEXT_ONLY_SECTIONS = ('chapter_multi_gpu/cluster.html',)
FRAMEWORKS = ('pytorch', 'mxnet', 'paddle')
# Schemes a page may use without touching the network or another file tree.
LOCAL_SCHEMES = ('data', 'blob', 'about')

pytestmark = pytest.mark.browser

_spec = importlib.util.spec_from_file_location('stored_outputs', ROOT / 'scripts' / 'stored_outputs.py')
stored_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stored_outputs)


def book_pages():
    """Every page of the book, as paths relative to the HTML root, from the sources."""
    pages = ['index.html']
    for md in sorted(ROOT.glob('chapter_*/*.md')):
        pages.append(md.relative_to(ROOT).with_suffix('.html').as_posix())
    return pages


def section_pages():
    """The chapters' section pages: every page that should carry code in three frameworks."""
    return [p for p in book_pages()
            if p.split('/')[0].startswith('chapter_') and not p.endswith('/index.html')
            and p.split('/')[0] not in NO_CODE_CHAPTERS]


def pages_with_outputs():
    """The section pages that run Python cells and so show their outputs."""
    return [p for p in section_pages() if p not in TEXT_ONLY_SECTIONS]


@pytest.fixture(scope='module')
def html_dir():
    if not (HTML_DIR / 'index.html').exists():
        pytest.fail(f'No built HTML book at {HTML_DIR} (BOOK_HTML_DIR). Build it '
                    f'with `make html`, or scripts/build-html.sh BOOK_ROOT and '
                    f'BOOK_HTML_DIR=BOOK_ROOT/_build/html.')
    return HTML_DIR


@pytest.fixture(scope='module')
def browser(html_dir):
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail('Playwright is missing from the environment: run `make setup` '
                    '(requirements.txt pins it)')
    if not (shutil.which(CHROMIUM) or pathlib.Path(CHROMIUM).exists()):
        pytest.fail(f'No Chromium at {CHROMIUM}: run `WITH_BROWSER=1 scripts/setup.sh` '
                    '(Debian package chromium) or set CHROMIUM to a Chromium binary.')
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which(CHROMIUM) or CHROMIUM,
            args=['--no-sandbox', '--disable-gpu', '--disable-background-networking',
                  '--disable-component-update', '--disable-sync', '--no-first-run',
                  # Nothing resolves: a request to a host fails instead of leaving.
                  '--host-resolver-rules=MAP * ~NOTFOUND'])
        yield browser
        browser.close()


class Visit:
    """One page in its own browser context, with everything it did recorded."""

    def __init__(self, browser, html_dir, page_path, context=None):
        self.html_dir = html_dir
        path, _, query = page_path.partition('?')
        self.url = (html_dir / path).as_uri() + (f'?{query}' if query else '')
        self.name = path.replace('/', '-').removesuffix('.html')
        self.own_context = context is None
        self.context = context or browser.new_context(viewport={'width': 1280, 'height': 900})
        self.requests, self.failed, self.errors = [], [], []
        # Requests for other hosts are recorded and aborted; file:// is not
        # routed, so it is checked from the request log below.
        self.context.route(re.compile(r'^(https?|wss?|ftp)://'), lambda route: route.abort())
        self.page = self.context.new_page()
        self.page.on('request', lambda r: self.requests.append(r.url))
        self.page.on('requestfailed', lambda r: self.failed.append(f'{r.url} ({r.failure})'))
        self.page.on('websocket', lambda ws: self.requests.append(ws.url))
        self.page.on('console', self._console)
        self.page.on('pageerror', lambda e: self.errors.append(f'uncaught: {e}'))
        self.page.goto(self.url, wait_until='load')
        self.page.evaluate('document.fonts.ready.then(() => true)')
        # MathJax loads deferred and typesets asynchronously.
        self.page.evaluate('''() => window.MathJax && MathJax.startup && MathJax.startup.promise
                                ? MathJax.startup.promise.then(() => true) : true''')

    def _console(self, message):
        if message.type == 'error':
            self.errors.append(f'console: {message.text} at {message.location.get("url")}')

    def foreign_requests(self):
        """Requests for anything but this book's own files."""
        root = self.html_dir.as_uri().rstrip('/') + '/'
        foreign = []
        for url in self.requests:
            scheme = urlparse(url).scheme
            if scheme == 'file' and unquote(url).startswith(unquote(root)):
                continue
            if scheme in LOCAL_SCHEMES:
                continue
            foreign.append(url)
        return foreign

    def screenshot(self, suffix=''):
        self.page.screenshot(path=str(SCREENSHOTS / f'{self.name}{suffix}.png'))

    def close(self):
        if self.own_context:
            self.context.close()


@pytest.fixture(scope='module')
def rendered(browser, html_dir):
    """One visit per page, shared by the checks; each finds the first tab shown."""
    visits = {}

    def get(page_path):
        if page_path not in visits:
            if not (html_dir / page_path).exists():
                pytest.fail(f'{page_path} is missing from {html_dir}: the build dropped a page')
            visits[page_path] = Visit(browser, html_dir, page_path)
            visits[page_path].screenshot()
        else:  # a check before may have chosen another tab: the first again
            visits[page_path].page.evaluate(
                "name => typeof bookShowTab !== 'function' || bookShowTab(name)",
                FRAMEWORKS[0])
        return visits[page_path]

    yield get
    for v in visits.values():
        v.close()


@pytest.fixture
def visit(browser, html_dir):
    opened = []

    def open_page(page_path, context=None):
        if not (html_dir / page_path.partition('?')[0]).exists():
            pytest.fail(f'{page_path} is missing from {html_dir}: the build dropped a page')
        opened.append(Visit(browser, html_dir, page_path, context))
        return opened[-1]

    yield open_page
    for v in opened:
        v.close()


@pytest.mark.parametrize('page_path', book_pages() + ['search.html', 'genindex.html'])
def test_page_renders_offline_from_its_own_files(rendered, page_path):
    """No request leaves the book's folder, nothing fails to load, no script errors."""
    v = rendered(page_path)
    assert v.foreign_requests() == [], f'{page_path} requested other hosts or files'
    assert v.failed == [], f'{page_path} failed to load'
    assert v.errors == [], f'{page_path} logged errors'


@pytest.mark.parametrize('page_path', book_pages())
def test_every_image_loads(rendered, page_path):
    v = rendered(page_path)
    images = v.page.evaluate('''() => Array.from(document.images).map(
        img => ({src: img.currentSrc || img.src, complete: img.complete, width: img.naturalWidth}))''')
    broken = [img['src'] for img in images if not img['complete'] or img['width'] == 0]
    assert broken == [], f'images that did not load on {page_path}'


@pytest.mark.parametrize('page_path', book_pages())
def test_math_is_typeset(rendered, page_path):
    v = rendered(page_path)
    math = v.page.evaluate('''() => {
        const nodes = Array.from(document.querySelectorAll('span.math, div.math'));
        const text = Array.from(document.querySelectorAll(
            '.page-content p, .page-content li, .page-content td, .page-content figcaption, '
            + '.page-content h1, .page-content h2, .page-content h3'))
            .filter(el => !el.closest('pre, code, .highlight'))
            .map(el => el.textContent).join('\\n');
        return {
            total: nodes.length,
            untypeset: nodes.filter(n => !n.querySelector('mjx-container'))
                            .map(n => n.textContent.slice(0, 80)),
            typeset: document.querySelectorAll('mjx-container').length,
            raw: (text.match(/\\$\\$|\\\\\\(|\\\\\\[/g) || []).length,
        };
    }''')
    source = (ROOT / page_path).with_suffix('.md')
    if source.exists() and '$' in re.sub(r'```.*?```', '', source.read_text(), flags=re.S):
        assert math['total'] > 0, f'{source.name} has math, but {page_path} has none'
    assert math['untypeset'] == [], f'math left untypeset on {page_path}'
    assert math['typeset'] >= math['total']
    assert math['raw'] == 0, f'raw TeX delimiters in the text of {page_path}'


@pytest.mark.parametrize('page_path', book_pages())
def test_cross_references_and_citations_resolve(rendered, page_path):
    v = rendered(page_path)
    found = v.page.evaluate('''() => ({
        unresolved: (document.querySelector('.page-content').innerText.match(/\\?\\?\\?/g) || []).length,
        problems: Array.from(document.querySelectorAll('.problematic, .system-message'))
                       .map(el => el.textContent.slice(0, 80)),
        numrefs: document.querySelectorAll('.page-content a.reference.internal span.std-numref').length,
    })''')
    assert found['unresolved'] == 0, f'"???" (an unresolved reference) on {page_path}'
    assert found['problems'] == [], f'Sphinx error markup on {page_path}'
    source = (ROOT / page_path).with_suffix('.md')
    if source.exists():
        text = source.read_text()
        if ':numref:' in text:
            assert found['numrefs'] > 0, f':numref: in {source.name} rendered no link'
        if ':cite:' in text:
            cites = v.page.evaluate('''() => Array.from(document.querySelectorAll(
                '.page-content a.reference.internal[href*="zreferences.html#"]')).length''')
            assert cites > 0, f':cite: in {source.name} rendered no link to the bibliography'


def visible_panels(page):
    """For each tab group: its tab names, the active tab, and the ids of visible panels."""
    return page.evaluate('''() => Array.from(document.querySelectorAll('.mdl-tabs')).map(group => {
        const bar = group.querySelector(':scope > .mdl-tabs__tab-bar');
        const links = Array.from(bar.querySelectorAll('.mdl-tabs__tab'));
        const panels = Array.from(group.querySelectorAll(':scope > .mdl-tabs__panel'));
        return {
            tabs: links.map(a => a.textContent.trim()),
            active: links.filter(a => a.classList.contains('is-active')).map(a => a.textContent.trim()),
            visible: panels.filter(p => p.offsetParent !== null || p.getClientRects().length > 0)
                           .map(p => p.id),
            text: panels.filter(p => p.getClientRects().length > 0).map(p => p.innerText).join('\\n'),
        };
    })''')


@pytest.mark.parametrize('page_path', section_pages())
def test_tab_bar_switches_the_visible_code_between_frameworks(rendered, page_path):
    v = rendered(page_path)
    groups = visible_panels(v.page)
    assert groups, f'{page_path} has no tab bar: every section shows its code in three frameworks'
    named = sorted({t for g in groups for t in g['tabs']})
    assert set(FRAMEWORKS) <= set(named), f'{page_path} has tabs for {named} only'
    shown = {}
    for framework in FRAMEWORKS:
        link = v.page.locator('.mdl-tabs__tab-bar .mdl-tabs__tab', has_text=framework).first
        link.scroll_into_view_if_needed()
        link.click()
        v.page.wait_for_timeout(100)
        groups = visible_panels(v.page)
        for i, group in enumerate(groups):
            if framework in group['tabs']:
                assert group['active'] == [framework], (
                    f'tab group {i} on {page_path} marks {group["active"]} active after '
                    f'choosing {framework}')
                assert len(group['visible']) == 1 and group['visible'][0].startswith(
                    framework + '-'), (f'tab group {i} on {page_path} shows panels '
                                       f'{group["visible"]} after choosing {framework}')
            else:
                assert group['visible'] == [], (
                    f'tab group {i} on {page_path} has no {framework} code but shows '
                    f'{group["visible"]}')
        shown[framework] = '\n'.join(g['text'] for g in groups)
        v.screenshot(f'-{framework}')
    assert len(set(shown.values())) == len(FRAMEWORKS), (
        f'switching tabs on {page_path} did not change the visible code')
    assert v.errors == [], f'switching tabs on {page_path} logged errors'


def page_layout(page):
    """Where the page's text, right-hand table of contents and Previous/Next bar sit,
    the visible outputs whose lines run past their frame's right edge or into a
    scroll box, and the code blocks with a line under their copy button."""
    return page.evaluate('''() => {
        const box = el => {
            if (!el) return null;
            const r = el.getBoundingClientRect();
            return {left: r.left, right: r.right, top: r.top + window.scrollY,
                    bottom: r.bottom + window.scrollY, width: r.width,
                    parent: el.parentElement ? el.parentElement.className : ''};
        };
        return {
            viewport: window.innerWidth,
            text: box(document.querySelector('.page-content')),
            document: box(document.querySelector('.document')),
            toc: box(document.querySelector('.side-doc-outline')),
            toc_links: document.querySelectorAll('.side-doc-outline a').length,
            footer: box(document.querySelector('.pagenation')),
            cut_outputs: Array.from(document.querySelectorAll(
                    '.page-content div.output pre, .page-content pre.output'))
                .filter(pre => pre.offsetParent !== null && (
                    pre.scrollWidth > pre.clientWidth + 1
                    || pre.scrollHeight > pre.clientHeight + 1))  // a scroll box
                .map(pre => pre.innerText.slice(0, 60)),
            // Code whose text reaches under the copy button or past the
            // block's visible right edge.
            under_button: Array.from(document.querySelectorAll('.page-content a.copybtn'))
                .map(button => [button, button.previousElementSibling])
                .filter(([button, pre]) => pre && pre.tagName === 'PRE'
                        && pre.getClientRects().length > 0)
                .filter(([button, pre]) => {
                    const b = button.getBoundingClientRect();
                    const right = pre.getBoundingClientRect().left + pre.clientLeft
                                  + pre.clientWidth;
                    const range = document.createRange();
                    range.selectNodeContents(pre);
                    return Array.from(range.getClientRects()).some(r => r.width > 0 && (
                        r.right > right + 0.5 || (r.bottom > b.top + 0.5
                            && r.top < b.bottom - 0.5 && r.right > b.left + 0.5)));
                })
                .map(([button, pre]) => pre.innerText.slice(0, 60)),
        };
    }''')


def layout_problems(layout):
    """What is out of place: the table of contents beside the text, the footer below it,
    an output line hidden past its frame."""
    text, toc, footer = layout['text'], layout['toc'], layout['footer']
    if not text:
        return ['no .page-content']
    problems = []
    if not toc or toc['parent'] != 'document':
        problems.append(f'the table of contents left its column: {toc}')
    elif not (toc['left'] >= text['right'] - 1 and toc['right'] <= layout['viewport'] + 1
              and toc['width'] > 100):
        problems.append(f'the table of contents is not right of the text: {toc} vs {text}')
    if not footer or footer['parent'] != 'mdl-layout__content':
        problems.append(f'the Previous/Next bar left the end of the page: {footer}')
    elif footer['top'] < max(text['bottom'], layout['document']['bottom']) - 1:
        problems.append(f'the Previous/Next bar covers the text: {footer} vs {text}')
    if layout['cut_outputs']:  # a long line (an error message) must wrap
        problems.append(f'outputs hide lines past the frame or in a scroll box: '
                        f'{layout["cut_outputs"]}')
    if layout['under_button']:
        problems.append(f"code runs under the copy button or past the block's edge: "
                        f"{layout['under_button']}")
    return problems


def first_code_line(code):
    """The first line of a cell that is code, not a d2lbook mark such as #@save."""
    return next((line.strip() for line in code.splitlines()
                 if line.strip() and not line.strip().startswith('#@')), '')


def shared_cells(source):
    """First code lines of the cells of markdown SOURCE that every tab shares."""
    shared = set()
    for code in CELL.findall(source.read_text()):
        mark = code.split('\n', 1)[0].strip()
        tabs = ({t.strip() for t in mark[len('#@tab'):].split(',')}
                if mark.startswith('#@tab') else {FRAMEWORKS[0]})
        if 'all' in tabs or set(FRAMEWORKS) <= tabs:
            shared.add(first_code_line(code))
    return shared


def escaped_from_tabs(page, shared):
    """Headings inside a tab group, and code cells outside one that not every tab shares."""
    found = page.evaluate('''() => {
        const content = document.querySelector('.page-content');
        return {
            headings: Array.from(content.querySelectorAll('h1, h2, h3, h4, h5, h6'))
                .filter(h => h.closest('.mdl-tabs'))
                .map(h => h.textContent.replace('\u00b6', '').trim()),
            cells: Array.from(content.querySelectorAll('div.highlight-python'))
                .filter(c => !c.closest('.mdl-tabs__panel')).map(c => c.innerText),
        };
    }''')
    return ([f'heading in a tab group: {h}' for h in found['headings']]
            + [f'code cell of some tabs outside their tab group: {first_code_line(c)}'
               for c in found['cells'] if first_code_line(c) not in shared])


@pytest.mark.parametrize('page_path', book_pages())
def test_every_page_keeps_its_table_of_contents_footer_and_outputs_in_place(rendered, page_path):
    """In every tab: the outline right of the text, the Previous/Next bar after it,
    every output line inside its frame."""
    v = rendered(page_path)
    frameworks = FRAMEWORKS if page_path in section_pages() else (None,)
    for framework in frameworks:
        if framework:
            v.page.locator('.mdl-tabs__tab-bar .mdl-tabs__tab', has_text=framework).first.click()
            v.page.wait_for_timeout(100)
        layout = page_layout(v.page)
        assert layout_problems(layout) == [], f'{page_path} [{framework}]'
        if page_path in section_pages():
            assert layout['toc_links'] > 0, f'{page_path} has an empty table of contents'


@pytest.mark.parametrize('page_path', section_pages())
def test_no_heading_or_code_cell_escapes_its_tab_group(rendered, page_path):
    """A heading belongs to every tab; a code cell to the tabs of its group."""
    shared = shared_cells((ROOT / page_path).with_suffix('.md'))
    assert escaped_from_tabs(rendered(page_path).page, shared) == []


# Code blocks that still lack a framework, by page and framework: each shows
# the notice "No <framework> version of this code". The list may only shrink
# (none left: every block has all three frameworks).
STILL_WITHOUT = {
}


@pytest.mark.parametrize('page_path', section_pages())
def test_every_code_block_shows_code_in_every_framework(rendered, page_path):
    """No tab shows the notice that a block has no code for its framework."""
    page = rendered(page_path).page
    for framework in FRAMEWORKS:
        missing = page.evaluate('''name => { bookShowTab(name);
            return Array.from(document.querySelectorAll(
                '.mdl-tabs.book-tab-missing')).map(g => (g.querySelector(
                '.mdl-tabs__panel') || g).innerText.trim().split('\\n')[0]); }''',
            framework)
        allowed = STILL_WITHOUT.get((page_path, framework), 0)
        assert len(missing) <= allowed, (
            f'{page_path}, {framework} tab: {len(missing)} code blocks say '
            f'"No {framework} version of this code" (first lines: '
            f'{missing}); give them {framework} code, or one sentence and '
            f'the nearest thing the framework has')


def test_framework_choice_carries_over_to_the_next_page(browser, html_dir, visit):
    pages = [p for p in section_pages() if (html_dir / p).exists()]
    if len(pages) < 2:
        pytest.skip('needs two section pages')
    first = visit(pages[0])
    first.page.locator('.mdl-tabs__tab-bar .mdl-tabs__tab', has_text='paddle').first.click()
    second = visit(pages[1], context=first.context)
    groups = [g for g in visible_panels(second.page) if 'paddle' in g['tabs']]
    assert groups, f'{pages[1]} has no paddle tab'
    assert all(g['active'] == ['paddle'] for g in groups), (
        f'{pages[1]} did not open on the framework chosen on {pages[0]}')


def test_search_finds_the_sections_offline(visit):
    """The search page works from disk: it lists hits and logs no error."""
    title = next(line[2:] for line in (ROOT / section_pages()[0]).with_suffix('.md')
                 .read_text().splitlines() if line.startswith('# '))
    word = max(re.findall(r'[A-Za-z]+', title), key=len)
    v = visit(f'search.html?q={word}')
    # Sphinx's search lists hits one by one and stops its progress dots
    # (_pulse_status -1) when done; the first hit is enough (slow under load).
    v.page.wait_for_function(
        "document.querySelectorAll('#search-results li a').length > 0 || "
        "(typeof Search !== 'undefined' && Search._pulse_status === -1)", timeout=60000)
    hits = v.page.locator('#search-results li a').count()
    # Each hit's excerpt, cut from the text of its page (offline too).
    v.page.wait_for_function(
        "document.querySelectorAll('#search-results li p.context').length > 0",
        timeout=30000)
    excerpts = v.page.locator('#search-results li p.context').all_inner_texts()
    v.screenshot()
    assert hits > 0, f'searching for {word!r} found nothing'
    assert any(word.lower() in e.lower() for e in excerpts), (
        f'the hits for {word!r} show no excerpt with the word: {excerpts[:3]}')
    assert v.foreign_requests() == [] and v.failed == [] and v.errors == [], (
        v.foreign_requests() + v.failed + v.errors)


class _Links(HTMLParser):
    """Collects ids and the local targets of href/src attributes of a page."""

    def __init__(self):
        super().__init__()
        self.ids, self.targets = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if 'id' in attrs:
            self.ids.add(attrs['id'])
        if tag == 'a' and 'name' in attrs:
            self.ids.add(attrs['name'])
        for key in ('href', 'src'):
            value = (attrs.get(key) or '').strip()  # as browsers do: mxtheme adds a space
            if value and not urlparse(value).scheme and not value.startswith('//'):
                if 'hidden' not in attrs:
                    self.targets.append(value)


def test_every_local_link_and_anchor_resolves(html_dir):
    """Cross-references, citations, downloads and assets point at files and ids that exist."""
    parsed = {}

    def page(path):
        if path not in parsed:
            parser = _Links()
            parser.feed(path.read_text(errors='replace'))
            parsed[path] = parser
        return parsed[path]

    broken = []
    for path in sorted(html_dir.rglob('*.html')):
        if {'_static', '_sources', '_images'} & set(path.relative_to(html_dir).parts):
            continue
        for target in page(path).targets:
            file_part, _, fragment = target.partition('#')
            file_part = unquote(file_part.split('?')[0])
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f'{path.relative_to(html_dir)}: {target} (no such file)')
            elif fragment and dest.suffix == '.html' and unquote(fragment) not in page(dest).ids:
                broken.append(f'{path.relative_to(html_dir)}: {target} (no such anchor)')
    assert broken == []


def test_notebook_downloads_hold_each_frameworks_notebooks(html_dir):
    """The header links every framework's zip, and each zip runs on its own."""
    index = (html_dir / 'index.html').read_text()
    link = re.search(r'href="([\w.-]+)-pytorch\.zip"', index)
    assert link, 'index.html has no link to the PyTorch notebooks zip'
    name = link[1]
    sources = [p.relative_to(ROOT).with_suffix('.ipynb').as_posix()
               for p in sorted(ROOT.glob('chapter_*/*.md'))]
    modules = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}
    for framework in FRAMEWORKS:
        archive = html_dir / f'{name}-{framework}.zip'
        assert f'href="{archive.name}"' in index, f'index.html does not link {archive.name}'
        with zipfile.ZipFile(archive) as z:
            names = set(z.namelist())
            folder = f'{name}-{framework}/'
            for nb in sources:
                assert folder + nb in names, f'{archive.name} lacks {nb}'
            assert folder + f'd2l/{modules[framework]}.py' in names
            assert folder + 'pyproject.toml' in names
            # What a notebook launches or reads next to itself ships with it.
            for script in sorted(ROOT.glob('chapter_*/*.py')):
                assert folder + script.relative_to(ROOT).as_posix() in names, (
                    f'{archive.name} lacks {script.relative_to(ROOT)}')
            with tempfile.TemporaryDirectory() as tmp:
                z.extractall(tmp)
                for nb in sources:
                    cells = json.loads((pathlib.Path(tmp) / folder / nb).read_text())['cells']
                    outputs = [c for c in cells if c.get('outputs')]
                    assert outputs == [], f'{nb} in {archive.name} still has outputs'


def page_text(path, leave_out=('script', 'style')):
    """The text a reader sees on a built page, tags and entities resolved,
    without the contents of the elements named in `leave_out`."""
    body = path.read_text(errors='replace')
    for element in leave_out:
        body = re.sub(rf'<{element}\b.*?</{element}>', '', body, flags=re.S)
    return html_lib.unescape(re.sub(r'<[^>]+>', '', body))


@pytest.mark.parametrize('page_path', book_pages())
def test_outputs_show_no_framework_banners_or_cpp_logs(html_dir, page_path):
    """No `Modified FLAGS detected`, glog-style C++ log line or abort dump reaches a page."""
    path = html_dir / page_path
    if not path.exists():
        pytest.fail(f'{page_path} is missing from {html_dir}: the build dropped a page')
    dirty = stored_outputs.dirty_lines(page_text(path))
    assert dirty == [], f'{page_path} shows framework banners, C++ log lines or abort dumps'


@pytest.mark.parametrize('page_path', pages_with_outputs())
def test_each_section_says_once_where_its_outputs_come_from(html_dir, page_path):
    text = re.sub(r'\s+', ' ', page_text(html_dir / page_path))
    notes = text.count('Where these outputs come from') + text.count(
        'Outputs of this page come from')
    assert notes == 1, f'{page_path} has {notes} notes on where its outputs come from, not one'
    note = re.search(r'(?:Where these outputs come from:|Outputs of this page come from)'
                     r'[^.]*?(?:: )?(.+?\d{4}-\d\d-\d\d)\.', text)
    assert note and re.search(r'CPU cores|GPU', note[1]), (
        f'{page_path} does not say on which devices and when its outputs were computed')
    # One line: each device description once, epochs as a number or not at all.
    devices = re.findall(r'\d+ CPU cores \([^)]*\), no GPU|\d+ x [^;]+', note[1])
    assert len(devices) == len(set(devices)), f'{page_path}: {note[1]}'
    assert 'as written in the code' not in note[1]


CODE_BLOCK = re.compile(r'<div class="highlight-python[^"]*"><div class="highlight"><pre>(.*?)</pre>',
                        re.S)


def code_blocks(path):
    """The code of every code block on a built page, as a reader sees it."""
    return [html_lib.unescape(re.sub(r'<[^>]+>', '', block))
            for block in CODE_BLOCK.findall(path.read_text(errors='replace'))]


@pytest.mark.parametrize('page_path', [p for p in pages_with_outputs()
                                       if p.startswith('chapter_multi_gpu/')])
def test_the_code_a_reader_retypes_calls_no_private_d2l_helper(html_dir, page_path):
    """Chapter code uses public `d2l` names; checks and plumbing live in the appendix."""
    blocks = code_blocks(html_dir / page_path)
    assert blocks, f'{page_path} shows no code block: the pattern no longer matches the HTML'
    private = sorted({name for block in blocks for name in re.findall(r'\bd2l\._\w+', block)})
    assert private == [], f'{page_path} shows private helpers: {private}'


TABLE_CELL = re.compile(r'<t[hd][^>]*>(.*?)</t[hd]>', re.S)


@pytest.mark.parametrize('page_path', section_pages())
def test_every_word_in_a_table_is_a_word_of_its_source(html_dir, page_path):
    """Pandoc wraps a table's cells at the widths its dashes give and cuts a
    word wider than its column: `Dist ributedDataParallel`, `c olumn-parallel`."""
    source = (ROOT / page_path).with_suffix('.md').read_text()
    cut = set()
    for cell in TABLE_CELL.findall((html_dir / page_path).read_text()):
        text = html_lib.unescape(re.sub(r'<[^>]+>', ' ', cell))
        for word in re.findall(r'[A-Za-z0-9_][\w-]*', text):
            if not re.search(rf'(?<![\w-]){re.escape(word)}(?![\w-])', source):
                cut.add(word)
    assert cut == set(), f'{page_path} shows table words its source lacks: {cut}'


@pytest.mark.parametrize('page_path', section_pages())
def test_no_markup_leaks_into_the_text_as_backticks(html_dir, page_path):
    """A code literal that Pandoc wrapped between its backticks renders as
    `` _SumOverRanks`` in italics instead of as code."""
    text = page_text(html_dir / page_path,
                     leave_out=('script', 'style', 'pre', 'code', 'textarea'))
    leaks = [text[max(0, m.start() - 30):m.end() + 30].replace('\n', ' ')
             for m in re.finditer('`+', text)]
    assert leaks == [], f'{page_path} shows raw backticks: {leaks[:3]}'


def test_the_bibliography_labels_each_entry_as_the_text_cites_it(html_dir):
    """Not "[Sergeev & DelBalso, 2018]" below "Sergeev and Del Balso, 2018"."""
    cited = {}
    for page in html_dir.rglob('*.html'):
        for link, text in re.findall(r'<a class="reference internal" href="[^"#]*'
                                     r'zreferences\.html#([\w-]+)"[^>]*>(.*?)</a>',
                                     page.read_text(), flags=re.S):
            cited.setdefault(link, set()).add(re.sub(r'<[^>]+>', '', text))
    bibliography = (html_dir / 'chapter_references' / 'zreferences.html').read_text()
    labels = dict(re.findall(r'<div class="citation" id="([\w-]+)"[^>]*>\s*<span class='
                             r'"label"><span class="fn-bracket">\[</span>([^<]*)<',
                             bibliography))
    assert labels, 'no labelled entry on the bibliography page: the pattern no longer matches'
    assert len(cited) >= len(labels) > 0
    differ = {labels[key]: texts for key, texts in cited.items() if {labels.get(key)} != texts}
    assert differ == {}, f'labels that differ from the citations in the text: {differ}'



@pytest.mark.parametrize('page_path', book_pages() + ['search.html'])
def test_no_page_is_wider_than_a_400_px_screen(browser, visit, page_path):
    """A phone shows the page without scrolling sideways; wide code, tables
    and equations scroll inside their own frames."""
    context = browser.new_context(viewport={'width': 400, 'height': 800})
    try:
        v = visit(page_path, context=context)
        wide = v.page.evaluate('''() => {
            const content = document.querySelector('.mdl-layout__content')
                            || document.documentElement;
            const width = content.clientWidth;
            const clipped = el => {
                for (let a = el.parentElement; a && a !== content; a = a.parentElement)
                    if (getComputedStyle(a).overflowX !== 'visible') return true;
                return false;
            };
            return {
                width: width,
                scroll: Math.max(content.scrollWidth, document.documentElement.scrollWidth),
                past: Array.from(content.querySelectorAll('*'))
                    .filter(el => el.getBoundingClientRect().right > width + 0.5
                            && !clipped(el))
                    .map(el => `${el.tagName}.${el.className}`.slice(0, 60)).slice(0, 5),
            };
        }''')
        assert wide['scroll'] <= wide['width'], (
            f'{page_path} is {wide["scroll"] - wide["width"]} px wider than a '
            f'{wide["width"]} px screen: {wide["past"]}')
    finally:
        context.close()


OUTPUT_BLOCK = re.compile(r'<div class="output[^"]*">\s*<div class="highlight"><pre>(.*?)</pre>',
                          re.S)


@pytest.mark.parametrize('page_path', pages_with_outputs())
def test_outputs_are_plain_text(html_dir, page_path):
    """An output is shown as printed: no syntax colours, and no line joined
    to the next where it ended in a backslash."""
    page = (html_dir / page_path).read_text(errors='replace')
    outputs = OUTPUT_BLOCK.findall(page)
    assert outputs, f'{page_path} shows no output block: the pattern no longer matches'
    coloured = [html_lib.unescape(re.sub(r'<[^>]+>', '', o))[:60] for o in outputs
                if re.search(r'<span class="', o)]
    assert coloured == [], f'{page_path} highlights outputs as code: {coloured[:3]}'
    assert '<pre class="output' not in page, f'{page_path} has a parsed-literal output'
    shown = '\n'.join(html_lib.unescape(re.sub(r'<[^>]+>', '', o)) for o in outputs)
    for tab in FRAMEWORKS:
        stored = ROOT / 'outputs' / tab / pathlib.Path(page_path).with_suffix('.ipynb')
        if not stored.exists():
            continue
        for cell in json.loads(stored.read_text())['cells']:
            for output in cell.get('outputs', []):
                for line in ''.join(output.get('text', '')).splitlines():
                    if line.rstrip().endswith('\\'):
                        assert line.rstrip() in shown, (
                            f'{page_path} [{tab}] lost the output line {line.strip()!r}')


@pytest.mark.parametrize('page_path', book_pages())
def test_no_raw_tex_escape_or_doubled_reference_parentheses(html_dir, page_path):
    """No `world\\_size` (a TeX escape) and no `((1.8.2.1))` (parentheses
    around an equation reference, which brings its own), in text or math."""
    text = page_text(html_dir / page_path,  # prose and math, no code
                     ('script', 'style', 'pre', 'code', 'textarea'))
    escapes = re.findall(r'.{0,30}\\_.{0,30}', text)
    assert escapes == [], f'{page_path} shows raw TeX escapes: {escapes[:3]}'
    doubled = re.findall(r'.{0,30}(?<!\\)\(\s*\(\d.{0,30}', text)  # not \( of math
    assert doubled == [], f'{page_path} doubles a reference\'s parentheses: {doubled[:3]}'


@pytest.mark.parametrize('page_path', section_pages())
def test_every_tab_has_something_to_say(html_dir, page_path):
    """A tab shows code or prose of its own, never a note that it has none."""
    text = re.sub(r'\s+', ' ', page_text(html_dir / page_path))
    empty = re.findall(r'[^.]*\b(?:adds no code|no code here|nothing to add)\b[^.]*', text)
    assert empty == [], f'{page_path}: {empty}'


@pytest.mark.parametrize('page_path', section_pages())
def test_exercises_ask_for_each_frameworks_own_launcher(rendered, page_path):
    """The exercises a reader sees in the MXNet or PaddlePaddle tab do not
    ask for torchrun."""
    page = rendered(page_path).page
    seen = {}
    for framework in FRAMEWORKS:
        seen[framework] = page.evaluate('''name => { bookShowTab(name);
            const heading = Array.from(document.querySelectorAll('.page-content h2'))
                .find(h => h.textContent.includes('Exercises'));
            return heading ? heading.closest('section, div.section').innerText : null;
        }''', framework)
    if seen['pytorch'] is None:
        pytest.skip(f'{page_path} has no exercises')
    for framework in ('mxnet', 'paddle'):
        assert 'torchrun' not in seen[framework], (
            f"{page_path}: the {framework} tab's exercises ask for torchrun")


def test_figures_number_devices_from_zero_as_ranks_are(html_dir):
    """A figure that numbers its devices starts at device 0, as the code does."""
    wrong = {}
    for svg in sorted((html_dir / '_images').glob('*.svg')):
        labels = re.findall(r'<text[^>]*>([^<]*)</text>', svg.read_text(errors='replace'))
        numbers = {int(n) for label in labels
                   for n in re.findall(r'\b(?:device|GPU|rank|worker) (\d+)\b', label)}
        if numbers and min(numbers) != 0:
            wrong[svg.name] = sorted(numbers)
    assert wrong == {}, f'figures that number devices from 1: {wrong}'
