"""scripts/offline_html.py on small hand-made HTML trees shaped like d2lbook's
output: what it repairs, and what it refuses. (The built book itself is checked
in a browser by test_rendered_book.py.)"""
import importlib.util
import pathlib

import pytest
from d2lbook import sphinx_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location('offline_html', ROOT / 'scripts' / 'offline_html.py')
offline_html = importlib.util.module_from_spec(spec)
spec.loader.exec_module(offline_html)

HEADER = ('<a  class="mdl-navigation__link" href="book.pdf">PDF</a>'
          '<a  class="mdl-navigation__link" href="book-pytorch.zip">Notebooks</a>')


def stock_tree(tmp_path):
    """A two-page site with the network-bound pieces d2lbook 1.0.3 writes."""
    html = tmp_path / 'html'
    (html / '_static' / 'material-design-lite-1.3.0').mkdir(parents=True)
    (html / 'chapter').mkdir()
    d2l_js = (sphinx_template.copybutton_js + sphinx_template.google_tracker.replace(
        'GOOGLE_ANALYTICS_TRACKING_ID', '') + sphinx_template.tabbar_js)
    (html / '_static' / 'd2l.js').write_text(d2l_js)
    (html / '_static' / 'copy-button.svg').write_text('<svg/>')
    for variant in ('blue_grey-orange', 'blue-deep_orange'):
        (html / '_static' / 'material-design-lite-1.3.0' / f'material.{variant}.min.css').write_text('')
    link = '<link rel="stylesheet" href="{}_static/material-design-lite-1.3.0/material.blue_grey-orange.min.css">'
    (html / 'index.html').write_text(link.format('') + HEADER)
    (html / 'chapter' / 'page.html').write_text(link.format('../') + HEADER)
    (html / 'book-pytorch.zip').write_bytes(b'PK')
    return html


def test_analytics_loader_and_remote_icon_are_removed(tmp_path):
    html = stock_tree(tmp_path)
    offline_html.make_offline(html)
    js = (html / '_static' / 'd2l.js').read_text()
    assert 'google-analytics' not in js and "ga('create'" not in js
    assert 'githubusercontent' not in js
    assert '${DOCUMENTATION_OPTIONS.URL_ROOT}_static/copy-button.svg' in js


def test_header_links_point_at_the_root_and_missing_downloads_are_hidden(tmp_path):
    html = stock_tree(tmp_path)
    offline_html.make_offline(html)
    offline_html.make_offline(html)  # idempotent
    page = (html / 'chapter' / 'page.html').read_text()
    assert 'href="../book-pytorch.zip"' in page
    assert '<a hidden  class="mdl-navigation__link" href="../book.pdf"' in page
    index = (html / 'index.html').read_text()
    assert '<a  class="mdl-navigation__link" href="book-pytorch.zip"' in index
    # Once the PDF exists, a rerun shows its link.
    (html / 'book.pdf').write_bytes(b'%PDF')
    offline_html.make_offline(html)
    assert '<a  class="mdl-navigation__link" href="../book.pdf"' in (
        html / 'chapter' / 'page.html').read_text()


def test_unused_theme_colour_variants_are_deleted(tmp_path):
    html = stock_tree(tmp_path)
    offline_html.make_offline(html)
    kept = sorted(p.name for p in (html / '_static' / 'material-design-lite-1.3.0').iterdir())
    assert kept == ['material.blue_grey-orange.min.css']


@pytest.mark.parametrize('where, content', [
    ('index.html', '<script async src="https://cdn.example.org/mathjax/tex-mml-chtml.js"></script>'),
    ('chapter/page.html', '<img alt="logo" src="//img.example.org/logo.png">'),
    ('_static/fonts.css', "@font-face { src: url('//fonts.example.org/a.woff2') }"),
    ('_static/book.css', '@import "http://styles.example.org/site.css";'),
])
def test_a_remaining_remote_load_fails_the_build(tmp_path, where, content):
    html = stock_tree(tmp_path)
    path = html / where
    path.write_text((path.read_text() if path.exists() else '') + content)
    with pytest.raises(offline_html.OfflineError, match='remote load'):
        offline_html.make_offline(html)


def test_links_to_other_sites_are_not_loads(tmp_path):
    html = stock_tree(tmp_path)
    index = html / 'index.html'
    index.write_text(index.read_text() + '<a href="https://github.com/d2l-ai/d2l-book">d2lbook</a>'
                     '<link rel="next" href="https://example.org/next.html">')
    offline_html.make_offline(html)


def test_a_folder_that_is_not_a_built_book_is_refused(tmp_path):
    with pytest.raises(offline_html.OfflineError, match='index.html is missing'):
        offline_html.make_offline(tmp_path)


def test_search_page_gets_every_pages_text_for_its_excerpts(tmp_path):
    html = stock_tree(tmp_path)
    (html / 'chapter' / 'page.html').write_text(
        '<nav>Menu</nav><div role="main"><h1>Ring<a class="headerlink" href="#r">'
        '\u00b6</a></h1><p>Each device  sends\n<code>n/k</code> bytes.</p>'
        '<script>var x = 1;</script><br><img src="a.png"></div><footer>Next</footer>')
    (html / 'search.html').write_text(
        '<head><script src="_static/doctools.js"></script>\n'
        '  <script type="text/javascript" src="_static/searchtools.js "></script></head>')
    for _ in range(2):  # idempotent
        offline_html.make_offline(html)
    texts = (html / '_static' / 'search-texts.js').read_text()
    assert '"chapter/page": "Ring Each device sends n/k bytes."' in texts
    assert 'Menu' not in texts and 'Next' not in texts and 'var x' not in texts
    search = (html / 'search.html').read_text()
    assert search.count('_static/search-texts.js') == 1
    assert search.index('search-texts.js') < search.index('searchtools.js')
