"""docs/results.md says what the committed run data says.

Every block between `<!-- results:NAME -->` markers is regenerated from
docs/results/data/ and compared with the page; after new runs,
`python scripts/reproduce.py report` rewrites them.
"""

import os
import re
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
    made = results_report.render_blocks(reproduce.DATA)
    seen = set()
    for doc in reproduce.DOCS:
      with open(doc, encoding='utf-8') as f:
        on_page = results_report.read_blocks(f.read())
      self.assertNotEmpty(on_page, doc)
      for name, block in on_page.items():
        self.assertIn(name, made, f'{doc}: unknown block {name!r}')
        self.assertEqual(block, made[name],
                         f'{doc}: block {name!r} is stale: run '
                         '`python scripts/reproduce.py report`')
      seen |= set(on_page)
    self.assertEqual(seen, set(made))

  def test_a_report_that_fails_leaves_every_page_as_it_was(self):
    # A page with a block the report does not make was left empty: it was
    # opened for writing before its blocks were filled.
    root = self.create_tempdir().full_path
    data = os.path.join(root, 'data')
    os.makedirs(data)
    pages = [os.path.join(root, 'a.md'), os.path.join(root, 'b.md')]
    with open(DOC, encoding='utf-8') as f:
      results = f.read()
    texts = [results, 'intro\n<!-- results:nope -->\nold\n'
             '<!-- /results:nope -->\n']
    for page, text in zip(pages, texts):
      with open(page, 'w', encoding='utf-8') as f:
        f.write(text)
    with self.assertRaisesRegex(KeyError, "a block 'nope' the report does "
                                'not make'):
      results_report.write_report(data, pages, None)
    # Pages that lack a block the report makes (the README's): nothing
    # written either (the pages were written before that was found).
    with self.assertRaisesRegex(KeyError, "no page has a block for "
                                r"\['readme_summary'\]"):
      results_report.write_report(data, [pages[0]], None)
    for page, text in zip(pages, texts):
      with open(page, encoding='utf-8') as f:
        self.assertEqual(f.read(), text)
    self.assertEqual(sorted(os.listdir(root)), ['a.md', 'b.md', 'data'])

  def test_numbers_in_the_prose_are_the_tables_numbers(self):
    # Prose between the blocks is written by hand: each decimal it quotes
    # must be a number of a block, rounded to either's precision.
    with open(DOC, encoding='utf-8') as f:
      text = f.read()
    block = r'<!-- results:(\w+) -->\n(.*?)<!-- /results:\1 -->'
    made = '\n'.join(b for _, b in re.findall(block, text, re.S))
    prose = re.sub(r'```.*?```', '', re.sub(block, '', text, flags=re.S),
                   flags=re.S)
    number = r'(?<![\w.])(-?\d[\d,]*\.\d+)'

    def parse(t):
      return float(t.replace(',', '')), len(t.split('.')[1])
    table = {parse(t) for t in re.findall(number, made)}
    known = {(d, round(abs(v), d)) for v, _ in table for d in range(5)}
    for t in re.findall(number, prose):
      v, d = parse(t)
      self.assertTrue(
          (d, round(abs(v), d)) in known
          or any(round(abs(v), e) == abs(w) for w, e in table),
          f'{t} in the prose of docs/results.md is in none of its tables')

  def test_a_sweep_under_way_compares_each_policy_on_its_own_seeds(self):
    # A policy run again on fewer seeds than `none` (its other seeds still
    # running) is compared with the recorded runs on those seeds only.
    recorded = results_report.load(reproduce.DATA, 'broad')
    again = results_report.load(reproduce.DATA, 'replica_broad')
    again['snooze2'] = {s: r for s, r in again['snooze2'].items() if s != 0}
    rows = [line.split(' | ') for line in results_report.replica_table(
        recorded, again).splitlines() if line.startswith('| `snooze2`')]
    self.assertEqual([r[1] for r in rows], ['recorded', 'run again'])
    self.assertEqual({r[2].split('/')[1] for r in rows},
                     {str(len(again['snooze2']))})

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
