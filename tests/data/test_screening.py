"""Tests for load-time screening: bad records skipped, misfits dropped."""

import os
import pickle

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo.data import screening
from jaxgrpo.data import sources

# One bad line of each kind, as raw bytes, and what its error says.
_BAD_LINES = {
    'malformed_json': (b'{"prompt": "1+1=", "answer": ', 'invalid JSON'),
    'not_utf8': (b'{"prompt": "caf\xe9", "answer": "1"}', 'not valid UTF-8'),
    'not_an_object': (b'["1+1=", "2"]', 'expected a JSON object'),
    'no_prompt': (b'{"question": "1+1=", "answer": "2"}',
                  "no field 'prompt'"),
    'no_answer': (b'{"prompt": "1+1="}', "no field 'answer'"),
    'empty_prompt': (b'{"prompt": "", "answer": "2"}', 'is empty'),
    'blank_prompt': (b'{"prompt": " \\t ", "answer": "2"}', 'is empty'),
    'empty_answer': (b'{"prompt": "1+1=", "answer": ""}',
                     r"'answer' \(the answer\) is empty"),
}


def _good(i: int) -> bytes:
  return f'{{"prompt": "{i}+0=", "answer": "{i}"}}'.encode()


class ScreenTest(parameterized.TestCase):

  def _file(self, lines: list[bytes]) -> str:
    path = os.path.join(self.create_tempdir().full_path, 'qa.jsonl')
    with open(path, 'wb') as f:
      f.write(b'\n'.join(lines) + b'\n')
    return path

  def _dataset(self, lines: list[bytes]):
    path = self._file(lines)
    return path, sources.make_dataset('jsonl', name='qa', path=path)

  @parameterized.named_parameters(
      (kind, line, message) for kind, (line, message) in _BAD_LINES.items())
  def test_skip_counts_and_excludes_each_kind(self, line, message):
    path, ds = self._dataset([_good(0), b'', line, _good(1)])
    with self.assertLogs(level='WARNING') as logs:
      kept, report = screening.screen(ds, name='qa', skip_bad=True)
    self.assertEqual([kept[i].answer for i in range(len(kept))], ['0', '1'])
    # Index-based ids stay those of the record's place in the file.
    self.assertEqual([kept[i].id for i in range(len(kept))], ['qa/0', 'qa/2'])
    self.assertEqual((report.scanned, report.kept, report.skipped),
                     (3, 2, 1))
    self.assertLen(report.skipped_first, 1)
    self.assertRegex(report.skipped_first[0], f'^{path}:3: .*{message}')
    self.assertLen(logs.output, 1)
    self.assertRegex(logs.output[0],
                     f'qa: 1 of 3 records skipped as bad: {path}:3: ')

  @parameterized.named_parameters(
      (kind, line, message) for kind, (line, message) in _BAD_LINES.items())
  def test_error_names_file_and_line(self, line, message):
    path, ds = self._dataset([_good(0), b'  ', line])
    with self.assertRaisesRegex(sources.BadRecordError,
                                f'^{path}:3: .*{message}'):
      screening.screen(ds, name='qa')

  def test_log_quotes_the_first_few_and_counts_all(self):
    lines = [line for line, _ in _BAD_LINES.values()]
    path, ds = self._dataset([_good(0)] + lines + [_good(1)])
    with self.assertLogs(level='WARNING') as logs:
      kept, report = screening.screen(ds, name='qa', skip_bad=True)
    self.assertLen(kept, 2)
    self.assertEqual(report.skipped, len(lines))
    self.assertLen(report.skipped_first, 3)
    for line, where in zip((2, 3, 4), report.skipped_first):
      self.assertStartsWith(where, f'{path}:{line}: ')
    self.assertLen(logs.output, 1)
    self.assertIn(f'{len(lines)} of {len(lines) + 2} records skipped',
                  logs.output[0])
    self.assertTrue(logs.output[0].endswith('; ...'))

  def test_reject_drops_and_counts(self):
    _, ds = self._dataset([_good(i) for i in range(6)])
    with self.assertLogs(level='WARNING') as logs:
      kept, report = screening.screen(
          ds, name='qa',
          reject=lambda ex: f'{ex.id}: odd' if int(ex.answer) % 2 else None)
    self.assertEqual([kept[i].id for i in range(len(kept))],
                     ['qa/0', 'qa/2', 'qa/4'])
    self.assertEqual((report.dropped, report.skipped), (3, 0))
    self.assertEqual(report.dropped_first, ('qa/1: odd', 'qa/3: odd',
                                            'qa/5: odd'))
    self.assertIn('qa: 3 of 6 examples dropped: qa/1: odd', logs.output[0])

  def test_limit_stops_the_pass(self):
    _, ds = self._dataset([_good(0), _BAD_LINES['not_utf8'][0], _good(1),
                           _good(2), b'{"bad'])
    kept, report = screening.screen(ds, name='qa', skip_bad=True, limit=2)
    self.assertEqual([kept[i].answer for i in range(len(kept))], ['0', '1'])
    self.assertEqual((report.scanned, report.skipped), (3, 1))

  def test_nothing_removed_logs_nothing(self):
    _, ds = self._dataset([_good(0), _good(1)])
    with self.assertNoLogs(level='WARNING'):
      kept, report = screening.screen(ds, name='qa', skip_bad=True)
    self.assertEqual([kept[i] for i in range(2)], [ds[0], ds[1]])
    self.assertEqual((report.skipped, report.dropped), (0, 0))

  def test_kept_dataset_pickles_and_fingerprints(self):
    _, ds = self._dataset([_good(0), b'{', _good(1), _good(2)])
    kept, _ = screening.screen(ds, name='qa', skip_bad=True)
    again = pickle.loads(pickle.dumps(kept))
    self.assertEqual([again[i] for i in range(3)],
                     [kept[i] for i in range(3)])
    self.assertEqual(sources.fingerprint(again), sources.fingerprint(kept))

  def test_array_record_bad_record_names_index(self):
    out = os.path.join(self.create_tempdir().full_path, 'qa.array_record')
    sources.write_array_record(out, [{'prompt': 'p', 'answer': 'a'},
                                     {'prompt': ' ', 'answer': 'b'}])
    ds = sources.make_dataset('array_record', name='qa', path=out)
    with self.assertLogs(level='WARNING'):
      kept, report = screening.screen(ds, name='qa', skip_bad=True)
    self.assertLen(kept, 1)
    self.assertStartsWith(report.skipped_first[0], f'{out}: record 1: ')


if __name__ == '__main__':
  absltest.main()
