"""The README and the docs pages name configs and files that exist, configs
load, links resolve, and the README stays short with every page reachable."""

import glob
import importlib
import itertools
import os
import re
from unittest import mock

from absl.testing import absltest

from jaxgrpo import config_lib
from jaxgrpo.configs import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, 'README.md')
DOCS = os.path.join(REPO, 'docs')
DOCS_INDEX = os.path.join(DOCS, 'README.md')
PICTURE = 'docs/sampler_policies.png'
MAX_README_LINES = 300
# The keys a template requires (config_dict.required_placeholder), with a
# value to validate it by.
REQUIRED_KEYS = {'qwen25_gsm8k': {'model.path': '/data/qwen'}}

# `--config=configs/NAME.py[:ARGS]`, also as the TPU VM scripts' CONFIG=.
CONFIG_FLAG = re.compile(
    r'(?:--config=|CONFIG=)(configs/(\w+)\.py)(?::([^\s\'"`\\)]+))?')
# A repository path under one of these folders, not inside a longer path.
# Commands run from the repository root, so a page names these paths from
# there wherever the page lives (links are checked separately).
REPO_PATH = re.compile(
    r'(?<![\w./-])((?:scripts|configs|benchmarks|tests|colab|docs)/'
    r'[\w./-]*[\w/])')
# Files the pages name as the reader's own, not the repository's.
PLACEHOLDERS = {
    'configs/my_config.py': 'docs/data.md "Adding a verifier": the reader\'s '
                            'own config',
    'configs/NAME.py': 'docs/configuration.md: any shipped config',
}
# A markdown link or image target: `](target)` or `](target "title")`.
LINK = re.compile(r'\]\(\s*([^)\s]+)(?:\s+"[^"]*")?\s*\)')
FENCE = re.compile(r'^```.*?^```[^\n]*$', re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r'`[^`\n]*`')
HEADING = re.compile(r'^#{1,6}\s+(.+?)\s*#*\s*$', re.MULTILINE)


def _read(path: str) -> str:
  with open(path, encoding='utf-8') as f:
    return f.read()


def _readme() -> str:
  return _read(README)


def _pages() -> dict[str, str]:
  """README.md and every docs/*.md page, by path from the repository root."""
  paths = [README] + sorted(glob.glob(os.path.join(DOCS, '*.md')))
  return {os.path.relpath(p, REPO): _read(p) for p in paths}


def _prose(text: str) -> str:
  """`text` without code blocks and code spans (where `](` is not a link)."""
  return INLINE_CODE.sub('', FENCE.sub('', text))


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  text = re.sub(r'[^\w\- ]', '', heading.strip().lower())
  return text.replace(' ', '-')


def _anchors(text: str) -> set[str]:
  seen: dict[str, int] = {}
  out = set()
  for heading in HEADING.findall(FENCE.sub('', text)):
    slug = _slug(heading)
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f'{slug}-{n}')
  return out


def _links(page: str, text: str) -> list[tuple[str, str, str]]:
  """(target as written, resolved path from the repository root, anchor) of
  every relative link in `page`."""
  out = []
  for target in LINK.findall(_prose(text)):
    if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.IGNORECASE):
      continue  # http:, https:, mailto:
    path, _, anchor = target.partition('#')
    if path:
      resolved = os.path.normpath(
          os.path.join(os.path.dirname(page), path))
    else:
      resolved = page
    out.append((target, resolved, anchor))
  return out


class ReadmeTest(absltest.TestCase):

  def test_configs_exist_load_and_validate(self):
    found = {}
    for page, text in _pages().items():
      for path, name, arg in CONFIG_FLAG.findall(text):
        found.setdefault((path, name, arg), page)
    self.assertNotEmpty(found)
    self.assertTrue(any(p == 'README.md' for p in found.values()))
    for (path, name, arg), page in sorted(found.items()):
      if path in PLACEHOLDERS:
        continue
      with self.subTest(page=page, config=f'{path}:{arg}' if arg else path):
        self.assertTrue(os.path.isfile(os.path.join(REPO, path)), path)
        module = importlib.import_module(f'jaxgrpo.configs.{name}')
        config_lib.from_config_dict(module.get_config(arg or None))

  def test_every_combination_of_config_switches_validates(self):
    # curriculum_demo.py:measure,runlocal was refused (stages without
    # strata): each true/false argument must work with the others.
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(
        os.path.join(REPO, 'jaxgrpo', 'configs', '*.py')))
    for name in names:
      module = importlib.import_module(f'jaxgrpo.configs.{name}')
      if not hasattr(module, 'get_config'):
        continue
      with mock.patch.object(common, 'parse_arg',
                             wraps=common.parse_arg) as parse_arg:
        module.get_config(None)
      switches = [k for k, v in parse_arg.call_args.kwargs.items()
                  if isinstance(v, bool)]
      for n in range(len(switches) + 1):
        for combo in itertools.combinations(switches, n):
          with self.subTest(config=f'{name}.py:{",".join(combo)}'):
            c = module.get_config(','.join(combo) or None)
            # A template's required keys (placeholders) name themselves.
            unset = config_lib.unset_keys(c)
            self.assertEqual(unset, sorted(REQUIRED_KEYS.get(name, {})))
            for key in unset:
              c.update_from_flattened_dict({key: REQUIRED_KEYS[name][key]})
            config_lib.from_config_dict(c)

  def test_paths_exist(self):
    for page, text in _pages().items():
      with self.subTest(page=page):
        paths = sorted(set(REPO_PATH.findall(text)) - set(PLACEHOLDERS))
        missing = [p for p in paths
                   if not os.path.exists(os.path.join(REPO, p))]
        self.assertEmpty(missing, f'{page} names paths that do not exist')

  def test_links_resolve(self):
    pages = _pages()
    for page, text in pages.items():
      for target, resolved, anchor in _links(page, text):
        with self.subTest(page=page, link=target):
          self.assertTrue(os.path.exists(os.path.join(REPO, resolved)),
                          f'{page} links to {target}: {resolved} is missing')
          if anchor and resolved.endswith('.md'):
            linked = pages.get(resolved)
            if linked is None:
              linked = _read(os.path.join(REPO, resolved))
            self.assertIn(anchor, _anchors(linked),
                          f'{page} links to {target}: no such heading')

  def test_sampler_picture_is_embedded(self):
    self.assertIn(f']({PICTURE})', _readme())
    path = os.path.join(REPO, PICTURE)
    self.assertTrue(os.path.isfile(path), PICTURE)
    self.assertLess(os.path.getsize(path), 200 * 1024)

  def test_readme_is_short(self):
    lines = _readme().count('\n')
    self.assertLess(lines, MAX_README_LINES,
                    'README.md is for the first screens; move the detail to '
                    'a page in docs/ and link it')

  def test_every_docs_page_is_linked(self):
    pages = _pages()
    linked = set()
    for index in ('README.md', os.path.relpath(DOCS_INDEX, REPO)):
      self.assertIn(index, pages)
      linked.update(resolved for _, resolved, _ in
                    _links(index, pages[index]))
    self.assertIn(os.path.relpath(DOCS_INDEX, REPO), linked,
                  'README.md does not link docs/README.md')
    unlinked = [page for page in pages
                if page != 'README.md' and page not in linked]
    self.assertEmpty(unlinked, 'docs pages linked from neither README.md '
                     'nor docs/README.md')


class PythonVersionTest(absltest.TestCase):
  """The Python the package says it runs on is one its dependencies run on
  (docs/scale-out.md: "jax needs 3.11 or newer")."""

  def test_requires_python_is_what_jax_requires(self):
    # pyproject.toml said >=3.10, so pip on 3.10 went looking for a jax it
    # could not find instead of naming the Python version.
    import importlib.metadata  # pylint: disable=g-import-not-at-top
    import tomllib  # pylint: disable=g-import-not-at-top
    with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
      ours = tomllib.load(f)['project']['requires-python']
    version = lambda spec: tuple(  # '>=3.11' -> (3, 11)
        int(part) for part in spec.strip().lstrip('>=').split('.')[:2])
    for dist in ('jax', 'jaxlib', 'flax', 'orbax-checkpoint', 'grain'):
      theirs = importlib.metadata.metadata(dist).get('Requires-Python')
      if theirs:
        self.assertGreaterEqual(version(ours), version(theirs),
                                f'{dist} requires Python {theirs}')


class DemoSizeTest(absltest.TestCase):
  """The demo model's size is written one way, the one the code computes."""

  def test_parameter_count_is_stated_as_computed(self):
    from jaxgrpo.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    from jaxgrpo.model import config as model_config  # pylint: disable=g-import-not-at-top
    cfg = model_config.preset(
        'demo', vocab_size=tokenizer_lib.make_tokenizer('char').vocab_size)
    stated = f'{model_config.param_count(cfg) / 1e6:.2f}M'
    texts = _pages()
    for path in ('configs/demo.py', 'colab/quickstart.ipynb'):
      texts[path] = _read(os.path.join(REPO, path))
    self.assertIn('docs/results.md', texts)
    self.assertIn(f'{stated}-parameter', texts['README.md'])
    for path, text in texts.items():
      for found in re.findall(r'(\d+\.\d+M)[- ]param', text):
        self.assertEqual(found, stated, f'{path} says {found} parameters')


if __name__ == '__main__':
  absltest.main()
