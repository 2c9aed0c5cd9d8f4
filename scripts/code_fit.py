"""List visible code lines over 79 characters and visible cells over 30 lines.

Visible: the code cells of chapter_multi_gpu/*.md and
chapter_appendix/*.md not marked #@hide, without their
#@tab/#@save/#@hide marker lines (d2lbook does not show those), and the
launcher scripts chapter_multi_gpu/*.py. Prints one line per problem and a
count; exits 1 if there is any.

    .venv/bin/python scripts/code_fit.py
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r'^\s*#\s*@(tab|save|hide)\b')
MAX_WIDTH, MAX_LINES = 79, 30


def cells(text):
    """(first line number, [(number, line), ...]) of each code cell of TEXT."""
    cell = None
    for number, line in enumerate(text.splitlines(), 1):
        if cell is None:
            if line.startswith('```{.python .input'):
                start, cell = number, []
        elif line.startswith('```'):
            yield start, cell
            cell = None
        else:
            cell.append((number, line))


def problems():
    pages = sorted(ROOT.glob('chapter_multi_gpu/*.md'))
    pages += sorted(ROOT.glob('chapter_appendix/*.md'))
    for page in pages:
        name = page.relative_to(ROOT)
        for start, cell in cells(page.read_text()):
            if any(re.match(r'^\s*#\s*@hide', line) for _, line in cell):
                continue
            shown = [(n, line) for n, line in cell if not MARKER.match(line)]
            if len(shown) > MAX_LINES:
                yield f'{name}:{start}: cell of {len(shown)} lines'
            for n, line in shown:
                if len(line) > MAX_WIDTH:
                    yield f'{name}:{n}: line of {len(line)} characters'
    for script in sorted(ROOT.glob('chapter_multi_gpu/*.py')):
        for n, line in enumerate(script.read_text().splitlines(), 1):
            if len(line) > MAX_WIDTH:
                yield (f'{script.relative_to(ROOT)}:{n}: line of {len(line)} '
                       'characters')


if __name__ == '__main__':
    found = list(problems())
    print('\n'.join(found + [f'{len(found)} problem(s)']))
    sys.exit(1 if found else 0)
