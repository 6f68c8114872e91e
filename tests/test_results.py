"""docs/results.md says what the committed run data says.

Every block between `<!-- results:NAME -->` markers is regenerated from
docs/results/data/ and compared with the page; after new runs,
`python scripts/reproduce.py report` rewrites them.
"""

import os
import sys

from absl.testing import absltest

from tests import test_train

sys.path.insert(0, os.path.join(test_train.REPO, 'scripts'))
# pylint: disable=g-import-not-at-top,wrong-import-position
import reproduce
import results_report

DOC = os.path.join(test_train.REPO, 'docs', 'results.md')


class ResultsPageTest(absltest.TestCase):

  def test_every_block_matches_the_data(self):
    with open(DOC, encoding='utf-8') as f:
      text = f.read()
    on_page = results_report.read_blocks(text)
    made = results_report.render_blocks(reproduce.DATA)
    self.assertEqual(sorted(on_page), sorted(made))
    for name, block in made.items():
      self.assertEqual(on_page[name], block,
                       f'docs/results.md block {name!r} is stale: run '
                       '`python scripts/reproduce.py report`')

  def test_figures_named_on_the_page_exist(self):
    with open(DOC, encoding='utf-8') as f:
      text = f.read()
    for line in text.splitlines():
      if line.startswith('![') and '](' in line:
        path = line.split('](', 1)[1].rstrip(')')
        self.assertTrue(
            os.path.exists(os.path.join(os.path.dirname(DOC), path)), path)

  def test_every_data_file_names_its_origin(self):
    for name in reproduce.experiments():
      folder = os.path.join(reproduce.DATA, name)
      if not os.path.isdir(folder):
        continue
      for fname in os.listdir(folder):
        header, records = reproduce.read_run(os.path.join(folder, fname))
        self.assertRegex(header['commit'], r'^[0-9a-f]{40}')
        self.assertTrue(header['command'].startswith(
            'python scripts/reproduce.py run'), fname)
        self.assertEqual(f'{header["variant"]}_s{header["seed"]}.jsonl.gz',
                         fname)
        self.assertEqual(records[-1]['step'], header['steps'], fname)


if __name__ == '__main__':
  absltest.main()
