#!/usr/bin/env python3
"""Make d2lbook's HTML output self-contained, then check that it is.

    python scripts/offline_html.py _build/html

d2lbook 1.0.3 writes three things into every page that reach for the
network: a Google Analytics loader (injected even with no tracking id), a
copy-button icon hot-linked from a code host, and header links that are only
right on the front page (a link to `d2l-multi-gpu.pdf` on a chapter page
points into the chapter's folder). MathJax and the theme's CJK fonts are
handled by the book's configuration (`mathjax_path`, static/fonts.css); this
script fixes the rest in place, deletes the theme's unused colour variants
(43 MB), and then fails if any page, script or style sheet still loads
anything from another host.

It also gives the search page its excerpts. Opened from disk, a page may not
fetch() another file, so Sphinx's search could list its hits only by title;
this script writes the text of every page into _static/search-texts.js,
which the search page loads and static/book.js serves in place of the page.

It is idempotent: `make pdf` runs it again after copying the PDF into the
HTML folder, which un-hides the PDF link.
"""
import argparse
import json
import pathlib
import re
import sys
from html.parser import HTMLParser

from d2lbook import sphinx_template

# d2lbook's analytics snippet, as it lands in d2l.js with an empty tracking id.
ANALYTICS = sphinx_template.google_tracker.replace(
    'GOOGLE_ANALYTICS_TRACKING_ID', '')
ANALYTICS_REPLACEMENT = (
    '\n// d2lbook\'s analytics loader was removed by scripts/offline_html.py;'
    '\n// tagClick, which the tab links call, is defined in static/book.js.\n')
REMOTE_ICON = ('https://raw.githubusercontent.com/choldgraf/sphinx-copybutton/'
               'master/sphinx_copybutton/_static/copy-button.svg')
LOCAL_ICON = '${DOCUMENTATION_OPTIONS.URL_ROOT}_static/copy-button.svg'

# A header link as mxtheme renders the [html] header_links of config.ini.
HEADER_LINK = re.compile(
    r'<a(?P<hidden> hidden)?  class="mdl-navigation__link" href="(?P<href>[^"]*)"')
# Attributes and CSS constructs that make a browser fetch something.
LOADING_ATTR = re.compile(
    r'<(?P<tag>script|img|iframe|source|video|audio|embed|link)\b[^>]*?'
    r'\b(?P<attr>src|href|data)\s*=\s*["\'](?P<url>[^"\']*)["\']', re.I)
CSS_URL = re.compile(r'url\(\s*["\']?(?P<url>[^"\')]+)["\']?\s*\)', re.I)
CSS_IMPORT = re.compile(r'@import\s+["\'](?P<url>[^"\']+)["\']', re.I)
# mxtheme ships one Material Design Lite style sheet per colour pair (43 MB in
# all) and Sphinx copies every one; a page links only one of them.
THEME_VARIANT = re.compile(r'^material\.[a-z_]+-[a-z_]+\.min\.css$')
REMOTE = re.compile(r'^\s*(?:[a-z][a-z0-9+.-]*:)?//', re.I)
LOCAL_SCHEMES = ('data:', 'blob:', 'about:')


class OfflineError(Exception):
    """The HTML is not self-contained, or d2lbook's output changed shape."""


def is_remote(url):
    """True for a URL that names a host (http://, https://, //host, ftp://)."""
    return bool(REMOTE.match(url)) and not url.lower().startswith(LOCAL_SCHEMES)


def patch_d2l_js(html_dir):
    """Remove the analytics loader and serve the copy-button icon locally."""
    path = html_dir / '_static' / 'd2l.js'
    if not path.exists():
        raise OfflineError(f'{path} is missing: is {html_dir} the output of '
                           '`d2lbook build html`?')
    text = original = path.read_text()
    text = text.replace(ANALYTICS, ANALYTICS_REPLACEMENT)
    text = text.replace(REMOTE_ICON, LOCAL_ICON)
    for leftover in ('google-analytics.com', 'raw.githubusercontent.com'):
        if leftover in text:
            raise OfflineError(
                f'{path} still mentions {leftover}: the d2lbook template '
                'changed; update ANALYTICS or REMOTE_ICON in this script')
    if text != original:
        path.write_text(text)
    icon = html_dir / '_static' / 'copy-button.svg'
    if not icon.exists():
        raise OfflineError(f'{icon} is missing: static/copy-button.svg must be '
                           'in html_static_path (see sphinx_configs in config.ini)')


def fix_header_links(html_dir, page):
    """Make the header links relative to `page`; hide those whose file is absent.

    mxtheme writes each link's href as given in config.ini on every page, so
    `d2l-multi-gpu.pdf` only works on pages in the HTML root. A link to a
    download that was not built (the PDF before `make pdf`) gets the
    `hidden` attribute rather than pointing at nothing.
    """
    depth = len(page.relative_to(html_dir).parts) - 1
    prefix = '../' * depth

    def rewrite(match):
        href = match['href']
        if is_remote(href) or href.startswith(('#', '/', 'mailto:')):
            return match[0]
        target = href
        while target.startswith('../'):
            target = target[3:]
        exists = (html_dir / target).exists()
        return (f'<a{"" if exists else " hidden"}  class="mdl-navigation__link" '
                f'href="{prefix}{target}"')

    text = page.read_text()
    new = HEADER_LINK.sub(rewrite, text)
    if new != text:
        page.write_text(new)


CITATION = '<div class="citation" '
CITATION_LIST = '<div role="list" class="citation-list">'


def fix_citation_list(page):
    """Open the citation list whose closing tag the bibliography page already has.

    With the pinned Sphinx 5.3 and docutils 0.19, docutils closes a list of
    citations with `</div>` after its last entry, but Sphinx's own HTML
    translator never writes the matching opening tag. The unpaired tag
    closes the theme's page column early: the table of contents and the
    Previous/Next bar leave their places. Adding the opening tag (once)
    balances the page.
    """
    text = page.read_text()
    if CITATION not in text or CITATION_LIST in text:
        return
    first = text.index(CITATION)
    page.write_text(text[:first] + CITATION_LIST + '\n' + text[first:])


CITED = re.compile(r'<a class="reference internal" href="[^"#]*zreferences\.html#(?P<id>[\w-]+)"'
                   r'[^>]*>(?P<text>.*?)</a>', re.S)
LABEL = re.compile(r'(<div class="citation" id="(?P<id>[\w-]+)"[^>]*>\s*<span class="label">'
                   r'<span class="fn-bracket">\[</span>)(?P<label>[^<]*)(<span)')


def fix_citation_labels(html_dir, bibliography):
    """Label each bibliography entry as the text cites it ("Sergeev and Del Balso, 2018").

    The bibliography's labels come from a different style than the citations
    in the text: "Sergeev & DelBalso, 2018" against "Sergeev and Del Balso,
    2018". The label of an entry becomes the text of the links to it.
    """
    cited = {}
    for page in html_dir.rglob('*.html'):
        for match in CITED.finditer(page.read_text()):
            cited.setdefault(match['id'], re.sub(r'<[^>]+>', '', match['text']))
    text = bibliography.read_text()
    new = LABEL.sub(lambda m: m[1] + cited.get(m['id'], m['label']) + m[4], text)
    if new != text:
        bibliography.write_text(new)


def prune_theme_variants(html_dir):
    """Delete the Material Design Lite colour variants that no page links."""
    folder = html_dir / '_static' / 'material-design-lite-1.3.0'
    if not folder.is_dir():
        return
    index = (html_dir / 'index.html').read_text()
    used = set(re.findall(r'material\.[a-z_]+-[a-z_]+\.min\.css', index))
    if not used:
        raise OfflineError('index.html links no Material Design Lite style '
                           'sheet: the mxtheme layout changed; update this script')
    for path in folder.iterdir():
        if THEME_VARIANT.match(path.name) and path.name not in used:
            path.unlink()


SEARCH_TEXTS = '_static/search-texts.js'
SEARCH_TOOLS = re.compile(r'<script[^>]*src="_static/searchtools\.js\s*"')


class _MainText(HTMLParser):
    """The text of a page's [role=main] element, without scripts, styles and
    the pilcrows of heading links: what Sphinx's search cuts its excerpt from."""

    SKIP = ('script', 'style')
    VOID = ('area', 'base', 'br', 'col', 'embed', 'hr', 'img', 'input', 'link',
            'meta', 'source', 'track', 'wbr')
    BLOCKS = ('p', 'div', 'section', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'li',
              'dt', 'dd', 'td', 'th', 'pre', 'figcaption', 'blockquote')

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0  # open elements inside main, main included
        self.skip = 0  # open elements whose text does not count
        self.parts = []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        attrs = dict(attrs)
        if self.depth:
            self.depth += 1
            if self.skip or tag in self.SKIP or 'headerlink' in (attrs.get('class') or ''):
                self.skip += 1
        elif attrs.get('role') == 'main':
            self.depth = 1

    def handle_endtag(self, tag):
        if tag in self.VOID or not self.depth:
            return
        self.depth -= 1
        if self.skip:
            self.skip -= 1
        elif tag in self.BLOCKS:
            self.parts.append(' ')  # "Ring" and "Each" in <h1>Ring</h1><p>Each

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.parts.append(data)

    def text(self):
        return re.sub(r'\s+', ' ', ''.join(self.parts)).strip()


def write_search_texts(html_dir):
    """Write every page's text into SEARCH_TEXTS; let search.html load it."""
    texts = {}
    for page in sorted(html_dir.rglob('*.html')):
        relative = page.relative_to(html_dir)
        if relative.parts[0] in ('_static', '_sources', '_images') or \
                relative.as_posix() in ('search.html', 'genindex.html'):
            continue
        parser = _MainText()
        parser.feed(page.read_text(errors='replace'))
        texts[relative.with_suffix('').as_posix()] = parser.text()
    # A page without a [role=main] element gets no excerpt; the browser
    # tests' search check fails then.
    (html_dir / SEARCH_TEXTS).write_text(
        '// The text of every page, for the search excerpts (written by\n'
        '// scripts/offline_html.py; read by static/book.js).\n'
        'var BOOK_SEARCH_TEXTS = ' + json.dumps(texts, ensure_ascii=False) + ';\n')
    search = html_dir / 'search.html'
    if not search.exists():
        return
    text = search.read_text()
    if SEARCH_TEXTS in text:
        return
    match = SEARCH_TOOLS.search(text)
    if not match:
        raise OfflineError('search.html does not load _static/searchtools.js: '
                           'the Sphinx layout changed; update SEARCH_TOOLS')
    tag = f'<script type="text/javascript" src="{SEARCH_TEXTS}"></script>\n  '
    search.write_text(text[:match.start()] + tag + text[match.start():])


def remote_loads(html_dir):
    """Every (file, url) in the output that would be fetched from another host."""
    found = []
    for path in sorted(html_dir.rglob('*')):
        if path.suffix == '.html':
            text = path.read_text(errors='replace')
            for match in LOADING_ATTR.finditer(text):
                tag, attr = match['tag'].lower(), match['attr'].lower()
                # <link rel="next" href=...> is navigation, not a load; only
                # style sheets and icons are fetched.
                if tag == 'link' and not re.search(
                        r'rel=["\'][^"\']*(stylesheet|icon|preload|modulepreload)',
                        match[0], re.I):
                    continue
                if attr == 'href' and tag != 'link':
                    continue
                if is_remote(match['url']):
                    found.append((path, match['url']))
        elif path.suffix == '.css':
            text = path.read_text(errors='replace')
            for pattern in (CSS_URL, CSS_IMPORT):
                for match in pattern.finditer(text):
                    if is_remote(match['url']):
                        found.append((path, match['url']))
    return found


def make_offline(html_dir):
    html_dir = pathlib.Path(html_dir)
    if not (html_dir / 'index.html').exists():
        raise OfflineError(f'{html_dir}/index.html is missing: build the HTML '
                           'first (scripts/build-html.sh)')
    patch_d2l_js(html_dir)
    prune_theme_variants(html_dir)
    for page in html_dir.rglob('*.html'):
        fix_header_links(html_dir, page)
        fix_citation_list(page)
    bibliography = html_dir / 'chapter_references' / 'zreferences.html'
    if bibliography.exists():
        fix_citation_labels(html_dir, bibliography)
    write_search_texts(html_dir)
    found = remote_loads(html_dir)
    if found:
        lines = '\n'.join(f'  {p.relative_to(html_dir)}: {u}' for p, u in found[:20])
        raise OfflineError(
            f'{len(found)} remote load(s) left in {html_dir}; vendor the file '
            f'into static/ or drop it:\n{lines}')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('html_dir', nargs='?', default='_build/html')
    args = parser.parse_args(argv)
    try:
        make_offline(args.html_dir)
    except OfflineError as error:
        print(f'offline_html: {error}', file=sys.stderr)
        return 1
    print(f'offline_html: {args.html_dir} loads nothing from another host')
    return 0


if __name__ == '__main__':
    sys.exit(main())
