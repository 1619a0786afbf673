"""The README a newcomer reads in ten minutes: at most 250 lines, its
sections in the agreed order, and every file it or docs/ links exists."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDER = ('## Two commands', '## Your own environment', '## Distributed',
         '## How a run is wired', '## Layout', '## Links')
DOCS = ('parity.md', 'performance.md', 'security.md', 'multihost.md')


def _read(*parts):
  with open(os.path.join(REPO, *parts)) as f:
    return f.read()


def test_readme_is_short_and_in_order():
  text = _read('README.md')
  assert len(text.splitlines()) <= 250
  heads = [line for line in text.splitlines() if line.startswith('## ')]
  found = [next(i for i, h in enumerate(heads) if h.startswith(want))
           for want in ORDER]
  assert found == sorted(found), heads
  intro = text.split('\n## ', 1)[0]
  assert re.search(r'!\[[^\]]*\]\([^)]+\.png\)', intro), 'no results picture'


def test_readme_and_docs_links_exist():
  pages = [('README.md', _read('README.md'))] + [
      (f'docs/{name}', _read('docs', name)) for name in DOCS]
  for page, text in pages:
    base = os.path.dirname(os.path.join(REPO, page))
    for target in re.findall(r'\]\(([^)#\s]+)', text):
      if target.startswith(('http://', 'https://')):
        continue
      assert os.path.exists(os.path.join(base, target)), (page, target)
    for path in re.findall(r'`((?:bench|docs|experiments|agent|tests)/'
                           r'[\w./-]+\.(?:py|md|txt|png|flags|json))`', text):
      assert os.path.exists(os.path.join(REPO, path)), (page, path)
